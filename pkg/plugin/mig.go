package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// MIGMode is how a node offers the GPUs whose MIG mode is on.
type MIGMode string

const (
	// MIGModeDynamic publishes every profile at every placement of such a
	// GPU, with shared counters so that the scheduler never hands out
	// overlapping placements, and creates the MIG device at Prepare and
	// destroys it at Unprepare. It needs partitionable devices in the API
	// server; without them the plugin falls back to MIGModeStatic.
	MIGModeDynamic MIGMode = "dynamic"
	// MIGModeStatic publishes the MIG devices that exist (an operator's
	// layout) and never creates or destroys one.
	MIGModeStatic MIGMode = "static"
)

// MIGModes lists the valid modes.
var MIGModes = []MIGMode{MIGModeDynamic, MIGModeStatic}

// placementKey identifies a GPU instance by what gpudra records before it
// creates one: parent GPU, profile and start. Two GPU instances never share
// a start on one GPU.
type placementKey struct {
	parent    string
	profileID int
	start     int
}

func recordKey(d *claimstate.Device) placementKey {
	return placementKey{parent: d.ParentUUID, profileID: d.DynamicMIG.ProfileID, start: d.DynamicMIG.Start}
}

func instanceKey(gpu *hardware.GPU, m *hardware.MIGDevice) placementKey {
	return placementKey{parent: gpu.UUID, profileID: m.ProfileID, start: m.PlacementStart}
}

// ownedPlacements are the GPU instances the checkpoint says gpudra created
// (or is about to create): those of every record, started or completed.
func ownedPlacements(s *claimstate.State) map[placementKey]bool {
	owned := map[placementKey]bool{}
	for _, c := range s.Claims {
		for i := range c.Devices {
			if c.Devices[i].DynamicMIG != nil {
				owned[recordKey(&c.Devices[i])] = true
			}
		}
	}
	return owned
}

// unknownInstances returns, per GPU UUID, the MIG devices on GPUs with MIG
// mode on whose ownership gpudra does not know. In dynamic mode such a GPU
// is left out: gpudra must not destroy an instance it did not create, nor
// offer placements that overlap it. MIG devices discovery could not read
// (split compute instances, say) are unknown too: they occupy memory slices
// the counters would otherwise call free.
func unknownInstances(inv *hardware.Inventory, owned map[placementKey]bool) map[string][]string {
	unknown := map[string][]string{}
	for _, p := range inv.Problems {
		if p.MIGDevice != "" && p.UUID != "" {
			unknown[p.UUID] = append(unknown[p.UUID], fmt.Sprintf("%s (unreadable: %s)", p.MIGDevice, p.Err))
		}
	}
	for gi := range inv.GPUs {
		gpu := &inv.GPUs[gi]
		if !gpu.MIGEnabled {
			continue
		}
		for mi := range gpu.MIGDevices {
			m := &gpu.MIGDevices[mi]
			if !owned[instanceKey(gpu, m)] {
				unknown[gpu.UUID] = append(unknown[gpu.UUID], fmt.Sprintf("%s at %d (%s)", m.Profile, m.PlacementStart, m.UUID))
			}
		}
	}
	return unknown
}

// withoutGPUs returns a copy of inv without the GPUs whose UUIDs are keys
// of leave.
func withoutGPUs(inv *hardware.Inventory, leave map[string][]string) *hardware.Inventory {
	if len(leave) == 0 {
		return inv
	}
	out := *inv
	out.GPUs = nil
	for _, g := range inv.GPUs {
		if _, ok := leave[g.UUID]; !ok {
			out.GPUs = append(out.GPUs, g)
		}
	}
	return &out
}

// buildModel derives the published devices from an inventory: in dynamic
// mode without the GPUs that hold MIG instances of unknown ownership, which
// it returns too.
func (d *Driver) buildModel(ctx context.Context, inv *hardware.Inventory) (*devicemodel.Model, map[string][]string, error) {
	var opts []devicemodel.Option
	if o := d.vfioOption(); o != nil {
		opts = append(opts, o)
	}
	if d.sharing.Load() {
		opts = append(opts, devicemodel.WithSharing(d.cfg.Sharing))
	}
	if !d.dynamicMIG.Load() {
		model, err := devicemodel.Build(inv, opts...)
		return model, nil, err
	}
	var owned map[placementKey]bool
	err := d.store.View(ctx, func(s *claimstate.State) error {
		owned = ownedPlacements(s)
		return nil
	})
	if err != nil {
		// Without the records, no instance can be known as gpudra's.
		klog.FromContext(ctx).Error(err, "Reading checkpoint to tell gpudra's MIG instances from others; treating every instance as unknown")
		owned = map[placementKey]bool{}
	}
	unknown := unknownInstances(inv, owned)
	opts = append(opts, devicemodel.WithDynamicMIG())
	if d.migSwitcher != nil {
		opts = append(opts, devicemodel.WithMIGModeSwitching(canSwitchMIGMode))
	}
	model, err := devicemodel.Build(withoutGPUs(inv, unknown), opts...)
	return model, unknown, err
}

// reportUnknownMIG logs the GPUs left out for MIG instances of unknown
// ownership, and records a Node event when that set changes.
func (d *Driver) reportUnknownMIG(ctx context.Context, before, now map[string][]string) {
	if len(now) == 0 {
		if len(before) > 0 {
			klog.FromContext(ctx).Info("No GPU holds MIG instances of unknown ownership any more")
		}
		return
	}
	uuids := make([]string, 0, len(now))
	for uuid := range now {
		uuids = append(uuids, uuid)
	}
	slices.Sort(uuids)
	msgs := make([]string, 0, len(uuids))
	for _, uuid := range uuids {
		klog.FromContext(ctx).Error(nil, "GPU left out of the dynamic MIG devices: it holds MIG instances gpudra did not create; they are kept",
			"gpu", uuid, "instances", now[uuid])
		msgs = append(msgs, fmt.Sprintf("%s: %s", uuid, strings.Join(now[uuid], ", ")))
	}
	if !sameUnknown(before, now) {
		d.event(corev1.EventTypeWarning, "MIGOwnershipUnknown", fmt.Sprintf(
			"%d GPU(s) left out of the dynamic MIG devices because they hold MIG instances gpudra did not create (kept, never destroyed): %s. "+
				"Destroy them (nvidia-smi mig -dci; nvidia-smi mig -dgi) to offer the GPU again, or run the node with --mig-mode=static to publish the existing layout",
			len(now), strings.Join(msgs, "; ")))
	}
}

func sameUnknown(a, b map[string][]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// setUpMIG creates the MIG devices of the intent's dynamic devices, in
// order, filling in what was created. The caller has recorded the start of
// the preparation, so every instance created here is owned by a record
// before it exists. Devices that an adopted record says exist already are
// reused. On failure the instances created here are destroyed again and the
// error says which device failed.
func (d *Driver) setUpMIG(ctx context.Context, intent *claimstate.Intent, reuse map[placementKey]*hardware.MIGDevice) (map[string]*hardware.MIGDevice, error) {
	created := map[string]*hardware.MIGDevice{}
	var done []*claimstate.Device
	for i := range intent.Devices {
		cd := &intent.Devices[i]
		if cd.DynamicMIG == nil {
			continue
		}
		if _, ok := created[cd.Name]; ok {
			continue
		}
		if m := reuse[recordKey(cd)]; m != nil {
			created[cd.Name] = m
			fillCreated(cd, m)
			continue
		}
		if err := d.fault(StepCreateMIG, intent.UID); err != nil {
			return nil, errors.Join(err, d.tearDownMIG(ctx, done))
		}
		m, err := d.mig.CreateMIGDevice(ctx, migPlacement(cd))
		if err != nil {
			err = fmt.Errorf("create MIG device %s (%s at placement %d on GPU %s): %w", cd.Name, cd.DynamicMIG.Profile, cd.DynamicMIG.Start, cd.ParentUUID, err)
			return nil, errors.Join(err, d.tearDownMIG(ctx, done))
		}
		created[cd.Name] = &m
		fillCreated(cd, &m)
		done = append(done, cd)
	}
	// One device allocated for two requests appears twice; both entries
	// name the same instance.
	for i := range intent.Devices {
		cd := &intent.Devices[i]
		if m := created[cd.Name]; cd.DynamicMIG != nil && m != nil {
			fillCreated(cd, m)
		}
	}
	return created, nil
}

// tearDownMIG destroys the GPU instances of the given devices, all of them
// even if one fails.
func (d *Driver) tearDownMIG(ctx context.Context, devices []*claimstate.Device) error {
	var errs []error
	seen := map[placementKey]bool{}
	for _, cd := range devices {
		if cd.DynamicMIG == nil || seen[recordKey(cd)] {
			continue
		}
		seen[recordKey(cd)] = true
		if err := d.mig.DestroyMIGDevice(ctx, migPlacement(cd)); err != nil {
			errs = append(errs, fmt.Errorf("destroy MIG device %s (%s at placement %d on GPU %s): %w", cd.Name, cd.DynamicMIG.Profile, cd.DynamicMIG.Start, cd.ParentUUID, err))
		}
	}
	return errors.Join(errs...)
}

// tearDownRecord undoes what a record owns: first the sharing set up for
// its devices (an MPS daemon holds the device it serves), then the GPUs it
// passed through, then its MIG instances. Nothing after a failed step is undone, so the record keeps
// owning what is left.
func (d *Driver) tearDownRecord(ctx context.Context, c *claimstate.Claim) error {
	if err := d.tearDownSharing(ctx, c); err != nil {
		return err
	}
	if err := d.restoreVFIO(ctx, c); err != nil {
		return err
	}
	devices := make([]*claimstate.Device, 0, len(c.Devices))
	for i := range c.Devices {
		devices = append(devices, &c.Devices[i])
	}
	return d.tearDownMIG(ctx, devices)
}

func fillCreated(cd *claimstate.Device, m *hardware.MIGDevice) {
	cd.UUID = m.UUID
	cd.DynamicMIG.GIID = m.GIID
	cd.DynamicMIG.CIID = m.CIID
}

func migPlacement(cd *claimstate.Device) hardware.MIGPlacement {
	return hardware.MIGPlacement{ParentUUID: cd.ParentUUID, ProfileID: cd.DynamicMIG.ProfileID, Start: cd.DynamicMIG.Start}
}

// dynamicRecord is the record of a dynamic MIG device before creation.
func dynamicRecord(dev *devicemodel.Device) *claimstate.DynamicMIG {
	p := dev.Placement
	return &claimstate.DynamicMIG{Profile: p.Profile.Name, ProfileID: p.Profile.ProfileID, Start: p.Start, Size: p.Profile.PlacementSize}
}

// hasDynamicMIG reports whether any device of the intent is a dynamic MIG
// device.
func hasDynamicMIG(devices []claimstate.Device) bool {
	for i := range devices {
		if devices[i].DynamicMIG != nil {
			return true
		}
	}
	return false
}

// migDeviceByUUID finds an existing MIG device in the inventory.
func migDeviceByUUID(inv *hardware.Inventory, uuid string) (*hardware.GPU, *hardware.MIGDevice) {
	for gi := range inv.GPUs {
		for mi := range inv.GPUs[gi].MIGDevices {
			if inv.GPUs[gi].MIGDevices[mi].UUID == uuid {
				return &inv.GPUs[gi], &inv.GPUs[gi].MIGDevices[mi]
			}
		}
	}
	return nil, nil
}

// instanceAt finds the MIG device at a placement in the inventory.
func instanceAt(inv *hardware.Inventory, key placementKey) *hardware.MIGDevice {
	for gi := range inv.GPUs {
		gpu := &inv.GPUs[gi]
		if gpu.UUID != key.parent {
			continue
		}
		for mi := range gpu.MIGDevices {
			if instanceKey(gpu, &gpu.MIGDevices[mi]) == key {
				m := gpu.MIGDevices[mi]
				return &m
			}
		}
	}
	return nil
}

// canSwitchMIGMode reports whether gpudra may switch the GPU's MIG mode at
// Prepare: Hopper and newer switch without a node reboot; Ampere needs a
// GPU reset, which gpudra never does.
func canSwitchMIGMode(gpu hardware.GPU) bool {
	return gpu.MIGCapable && gpu.Architecture != "" && gpu.Architecture != "Ampere"
}

// modeSwitch is one MIG mode change a preparation needs.
type modeSwitch struct {
	gpuUUID string
	enable  bool
}

// modeSwitches lists the MIG mode changes the plan's devices need: MIG on
// for a dynamic MIG device of a GPU in MIG mode off, MIG off for a full
// GPU in MIG mode on.
func modeSwitches(plan *claimPlan) []modeSwitch {
	var out []modeSwitch
	seen := map[string]bool{}
	for _, dev := range plan.devices {
		gpu := dev.GPU
		if seen[gpu.UUID] {
			continue
		}
		switch {
		case dev.Placement != nil && !gpu.MIGEnabled:
			out = append(out, modeSwitch{gpuUUID: gpu.UUID, enable: true})
		case dev.Kind == devicemodel.KindGPU && gpu.MIGEnabled:
			out = append(out, modeSwitch{gpuUUID: gpu.UUID, enable: false})
		default:
			continue
		}
		seen[gpu.UUID] = true
	}
	return out
}

// switchMIGModes carries out the plan's MIG mode changes, then discovers
// the GPUs again (a switch may reset the GPU and change its minor number),
// republishes, and points the plan's devices at the GPUs as they are now.
// A GPU whose switch to MIG mode fails is set back to a full GPU.
func (d *Driver) switchMIGModes(ctx context.Context, plan *claimPlan, switches []modeSwitch) error {
	logger := klog.FromContext(ctx)
	for _, sw := range switches {
		if err := d.migSwitcher.SetMIGMode(ctx, sw.gpuUUID, sw.enable); err != nil {
			err = fmt.Errorf("switch MIG mode of GPU %s to %v: %w", sw.gpuUUID, onOff(sw.enable), err)
			if sw.enable {
				if back := d.migSwitcher.SetMIGMode(ctx, sw.gpuUUID, false); back != nil {
					err = errors.Join(err, fmt.Errorf("set it back to MIG mode off: %w", back))
				}
			}
			d.event(corev1.EventTypeWarning, "MIGModeSwitchFailed", err.Error()+"; the GPU stays a full GPU")
			return errors.Join(err, d.afterModeSwitch(ctx))
		}
		logger.Info("Switched MIG mode", "gpu", sw.gpuUUID, "migMode", onOff(sw.enable))
		d.event(corev1.EventTypeNormal, "MIGModeSwitched", fmt.Sprintf("MIG mode of GPU %s switched %s for a claim", sw.gpuUUID, onOff(sw.enable)))
	}
	if err := d.afterModeSwitch(ctx); err != nil {
		return err
	}
	inv := d.current().inv
	for i, dev := range plan.devices {
		for gi := range inv.GPUs {
			if inv.GPUs[gi].UUID == dev.GPU.UUID {
				moved := *dev
				moved.GPU = inv.GPUs[gi]
				plan.devices[i] = &moved
			}
		}
	}
	plan.node = d.current()
	return nil
}

// afterModeSwitch discovers the GPUs again and republishes.
func (d *Driver) afterModeSwitch(ctx context.Context) error {
	if err := d.discover(ctx); err != nil {
		return fmt.Errorf("discover GPUs after a MIG mode switch: %w", err)
	}
	if err := d.publish(ctx); err != nil {
		return err
	}
	return nil
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}
