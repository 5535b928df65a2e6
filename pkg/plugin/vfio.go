package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/config"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/vfio"
)

// VFIOConfig is what VFIO passthrough needs on this node.
type VFIOConfig struct {
	// Mode is how GPUs are offered for passthrough. With
	// devicemodel.VFIOBeside and an API server without partitionable
	// devices, no VFIO device is published (see --vfio=only).
	Mode devicemodel.VFIOMode
	// FS is sysfs (vfio.Dir of --sysfs-root on a real node).
	FS vfio.FS
	// Busy tells who holds a GPU; Prepare refuses a GPU in use.
	Busy vfio.BusyChecker
	// Modules loads the VFIO driver's module.
	Modules vfio.ModuleLoader
	// GPUDriver is the VFIO driver GPUs are bound to: vfio.VFIOPCI, or
	// vfio.NVGraceGPUVFIOPCI on Grace systems. Empty means vfio-pci.
	GPUDriver string
	// GPUs, if not empty, are the minors of the GPUs offered for
	// passthrough; the others are not.
	GPUs []int
}

// setUpVFIO makes the binder; one per process, since sysfs writes that
// outlive a cancelled call are tracked by it.
func (d *Driver) setUpVFIO() error {
	c := d.cfg.VFIO
	if c == nil {
		return nil
	}
	var opts []vfio.Option
	if c.GPUDriver != "" {
		opts = append(opts, vfio.WithGPUDriver(c.GPUDriver))
	}
	b, err := vfio.NewBinder(c.FS, c.Busy, c.Modules, opts...)
	if err != nil {
		return fmt.Errorf("VFIO: %w", err)
	}
	d.vfio = b
	d.vfioBeside.Store(c.Mode == devicemodel.VFIOBeside)
	return nil
}

// vfioOption is the device-model option that offers the node's GPUs for
// passthrough, or nil when none are.
func (d *Driver) vfioOption() devicemodel.Option {
	c := d.cfg.VFIO
	if c == nil || (c.Mode == devicemodel.VFIOBeside && !d.vfioBeside.Load()) {
		return nil
	}
	return c.ModelOption()
}

// ModelOption is the device-model option that offers the GPUs of c for
// passthrough: those with an IOMMU group in sysfs (and among GPUs, if
// set), with their PCI IDs and group. `gpudra inspect` uses it too.
func (c *VFIOConfig) ModelOption() devicemodel.Option {
	return devicemodel.WithVFIO(c.Mode, func(gpu hardware.GPU) (devicemodel.VFIOInfo, bool) {
		if len(c.GPUs) > 0 && !slices.Contains(c.GPUs, gpu.Minor) {
			return devicemodel.VFIOInfo{}, false
		}
		if !vfio.ValidBusID(gpu.PCIBusID) {
			return devicemodel.VFIOInfo{}, false
		}
		pci, err := vfio.ReadPCIDevice(c.FS, gpu.PCIBusID)
		if err != nil || pci.IOMMUGroup == nil {
			// IOMMU off or the function unknown to sysfs: no passthrough.
			return devicemodel.VFIOInfo{}, false
		}
		return devicemodel.VFIOInfo{VendorID: "0x" + pci.VendorID, DeviceID: "0x" + pci.DeviceID, IOMMUGroup: *pci.IOMMUGroup}, true
	})
}

// keepPassedThrough puts back into a new inventory the GPUs that claims
// hold passed through with VFIO, as the previous discovery saw them: NVML
// stops listing a GPU once it is bound to vfio-pci, but its devices must
// stay published while the claim holds it (its VFIO device is allocated,
// and its counters keep the GPU's other devices from being allocated)
// until Unprepare gives it back. A GPU the plugin never saw before it was
// bound (a restart while passed through) cannot be put back, and stays
// out until it is restored.
func (d *Driver) keepPassedThrough(ctx context.Context, inv *hardware.Inventory) *hardware.Inventory {
	if d.vfio == nil {
		return inv
	}
	held := map[string]bool{}
	_ = d.store.View(ctx, func(s *claimstate.State) error {
		for _, c := range s.Claims {
			for _, cd := range c.Devices {
				if cd.VFIO != nil {
					held[cd.UUID] = true
				}
			}
		}
		return nil
	})
	previous := d.state.Load()
	if len(held) == 0 || previous == nil {
		return inv
	}
	var missing []hardware.GPU
	for _, g := range previous.inv.GPUs {
		if held[g.UUID] && !slices.ContainsFunc(inv.GPUs, func(n hardware.GPU) bool { return n.UUID == g.UUID }) {
			missing = append(missing, g)
		}
	}
	if len(missing) == 0 {
		return inv
	}
	out := *inv
	out.GPUs = append(slices.Clone(inv.GPUs), missing...)
	slices.SortStableFunc(out.GPUs, func(a, b hardware.GPU) int { return a.Index - b.Index })
	klog.FromContext(ctx).V(2).Info("Keeping GPUs passed through with VFIO, which discovery no longer lists", "gpus", len(missing))
	return &out
}

// planVFIO records, for a VFIO device of the intent, what binding its
// IOMMU group changes. It reads sysfs only.
func (d *Driver) planVFIO(cd *claimstate.Device, dev *devicemodel.Device) error {
	if d.vfio == nil {
		return fmt.Errorf("device %s: this node does not pass GPUs through (no --vfio)", cd.Name)
	}
	rec, err := d.vfio.Plan(dev.GPU.PCIBusID)
	if err != nil {
		return fmt.Errorf("device %s: %w", cd.Name, err)
	}
	// A function on a VFIO driver already is not in the state to plan
	// from: its "original" driver would be the VFIO driver, and the GPU
	// would never be given back. Some record, or someone else, holds it.
	for _, f := range rec.Functions {
		if isVFIODriver(f.OriginalDriver) || isVFIODriver(f.OriginalDriverOverride) {
			return fmt.Errorf("device %s: PCI function %s of GPU %s is bound to %s (driver_override %q) already: another claim holds it, or a passthrough was not undone (after a lost checkpoint, give it back by hand: clear driver_override and bind it to nvidia)",
				cd.Name, f.BusID, rec.GPU, f.OriginalDriver, f.OriginalDriverOverride)
		}
	}
	cd.VFIO = toClaimVFIO(rec)
	return nil
}

// bindVFIO binds the IOMMU groups of the intent's VFIO devices to VFIO.
// The start record names them already; on failure the caller restores.
func (d *Driver) bindVFIO(ctx context.Context, intent *claimstate.Intent) error {
	for i := range intent.Devices {
		cd := &intent.Devices[i]
		if cd.VFIO == nil {
			continue
		}
		if err := d.vfio.Bind(ctx, fromClaimVFIO(cd.VFIO)); err != nil {
			return fmt.Errorf("device %s: pass GPU %s through: %w", cd.Name, cd.VFIO.GPU, err)
		}
	}
	return nil
}

// vfioEdits returns the CDI edits of the plan's VFIO devices, by intent
// index: their VFIO device nodes, as the resolved VfioDeviceConfig asks.
func (d *Driver) vfioEdits(plan *claimPlan) (map[int]*cdispec.ContainerEdits, error) {
	out := map[int]*cdispec.ContainerEdits{}
	for i := range plan.intent.Devices {
		cd := &plan.intent.Devices[i]
		if cd.VFIO == nil {
			continue
		}
		opts := vfio.NodeOptions{APIDevice: true}
		if c, ok := plan.configs[i].(*v1beta1.VfioDeviceConfig); ok {
			opts = vfio.NodeOptions{PreferIOMMUFD: c.IOMMU.PreferIOMMUFD(), APIDevice: c.IOMMU.APIDevice()}
		}
		nodes, err := vfio.DeviceNodes(d.cfg.VFIO.FS, fromClaimVFIO(cd.VFIO), opts)
		if err != nil {
			return nil, fmt.Errorf("device %s: %w", cd.Name, err)
		}
		edits := &cdispec.ContainerEdits{}
		for _, n := range nodes.DeviceNodes {
			edits.DeviceNodes = append(edits.DeviceNodes, &cdispec.DeviceNode{Path: n.Path, Type: "c", Major: n.Major, Minor: n.Minor})
		}
		out[i] = edits
	}
	return out, nil
}

// restoreVFIO gives the IOMMU groups of the record's VFIO devices back to
// their drivers. It is idempotent and safe on groups never bound.
func (d *Driver) restoreVFIO(ctx context.Context, c *claimstate.Claim) error {
	var errs []error
	for _, cd := range c.Devices {
		if cd.VFIO == nil {
			continue
		}
		if d.vfio == nil {
			errs = append(errs, fmt.Errorf("device %s: GPU %s was passed through, but this node does not pass GPUs through now (no --vfio); give it back by hand or run the plugin with --vfio", cd.Name, cd.VFIO.GPU))
			continue
		}
		if err := d.vfio.Restore(ctx, fromClaimVFIO(cd.VFIO)); err != nil {
			errs = append(errs, fmt.Errorf("device %s: %w", cd.Name, err))
		}
	}
	return errors.Join(errs...)
}

// hasVFIO reports whether any device of the list is passed through.
func hasVFIO(devices []claimstate.Device) bool {
	return slices.ContainsFunc(devices, func(cd claimstate.Device) bool { return cd.VFIO != nil })
}

// mergeEdits puts b's edits after a's, by intent index.
func mergeEdits(a, b map[int]*cdispec.ContainerEdits) map[int]*cdispec.ContainerEdits {
	out := map[int]*cdispec.ContainerEdits{}
	for _, m := range []map[int]*cdispec.ContainerEdits{a, b} {
		for i, e := range m {
			if prev := out[i]; prev != nil {
				merged := *prev
				merged.Env = append(slices.Clone(prev.Env), e.Env...)
				merged.DeviceNodes = append(slices.Clone(prev.DeviceNodes), e.DeviceNodes...)
				merged.Mounts = append(slices.Clone(prev.Mounts), e.Mounts...)
				out[i] = &merged
				continue
			}
			out[i] = e
		}
	}
	return out
}

func isVFIODriver(name string) bool {
	return name == vfio.VFIOPCI || name == vfio.NVGraceGPUVFIOPCI
}

func toClaimVFIO(r vfio.Record) *claimstate.VFIO {
	out := &claimstate.VFIO{GPU: r.GPU, IOMMUGroup: r.IOMMUGroup}
	for _, f := range r.Functions {
		out.Functions = append(out.Functions, claimstate.VFIOFunction(f))
	}
	return out
}

func fromClaimVFIO(c *claimstate.VFIO) vfio.Record {
	out := vfio.Record{GPU: c.GPU, IOMMUGroup: c.IOMMUGroup}
	for _, f := range c.Functions {
		out.Functions = append(out.Functions, vfio.Function(f))
	}
	return out
}

// configKind is the config kind a device of the model takes.
func configKind(dev *devicemodel.Device) config.DeviceKind {
	switch dev.Kind {
	case devicemodel.KindMIG:
		return config.MIG
	case devicemodel.KindVFIO:
		return config.VFIO
	}
	return config.GPU
}
