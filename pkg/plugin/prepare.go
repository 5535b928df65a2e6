package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/devicestatus"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/timeslice"
)

// Step names a point in the preparation of a claim at which the crash
// tests inject failures.
type Step string

// The steps of one preparation, in order.
const (
	// StepCreateMIG comes before each MIG device is created (dynamic MIG),
	// after the start of the preparation is recorded.
	StepCreateMIG       Step = "CreateMIG"
	StepWriteCDISpec    Step = "WriteCDISpec"
	StepRecordCompleted Step = "RecordCompleted"
)

// PrepareResourceClaims implements [kubeletplugin.DRAPlugin]. Claims of one
// call are prepared concurrently; their checkpoint writes are
// group-committed. Each claim gets its own result; the call itself fails
// only if the plugin cannot work at all.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	if len(claims) == 1 {
		results[claims[0].UID] = d.prepareClaim(ctx, claims[0])
		return results, nil
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, claim := range claims {
		wg.Go(func() {
			r := d.prepareClaim(ctx, claim)
			mu.Lock()
			results[claim.UID] = r
			mu.Unlock()
		})
	}
	wg.Wait()
	return results, nil
}

// UnprepareResourceClaims implements [kubeletplugin.DRAPlugin]. Unpreparing
// a claim this node does not know succeeds: the call is idempotent.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	results := make(map[types.UID]error, len(claims))
	if len(claims) == 1 {
		results[claims[0].UID] = d.unprepareClaim(ctx, claims[0])
		return results, nil
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, claim := range claims {
		wg.Go(func() {
			err := d.unprepareClaim(ctx, claim)
			mu.Lock()
			results[claim.UID] = err
			mu.Unlock()
		})
	}
	wg.Wait()
	return results, nil
}

func (d *Driver) prepareClaim(ctx context.Context, claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	uid := string(claim.UID)
	logger := klog.FromContext(ctx).WithValues("claim", klog.KObj(claim), "claimUID", uid)
	d.claimLocks.LockKey(uid)
	defer func() { _ = d.claimLocks.UnlockKey(uid) }()

	devices, err := d.prepared(ctx, claim)
	if err != nil {
		logger.Error(err, "Prepare failed")
		return kubeletplugin.PrepareResult{Err: fmt.Errorf("prepare claim %s/%s: %w", claim.Namespace, claim.Name, err)}
	}
	logger.V(2).Info("Prepared", "devices", len(devices))
	return kubeletplugin.PrepareResult{Devices: devices}
}

// prepared runs the state machine for one claim and returns what the
// kubelet gets. A claim prepared before is answered from its record before
// anything else is looked at, so a retry succeeds even if the node's devices
// changed since.
func (d *Driver) prepared(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	intent, err := d.intentOf(claim)
	if err != nil {
		return nil, err
	}
	if len(intent.Devices) == 0 {
		// Nothing of ours in this claim: nothing to set up or record.
		return []kubeletplugin.Device{}, nil
	}
	var action claimstate.PrepareAction
	var existing *claimstate.Claim
	err = d.store.View(ctx, func(s *claimstate.State) error {
		var err error
		action, existing, err = s.PlanPrepare(intent)
		if existing != nil {
			existing = existing.Clone()
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if action == claimstate.ActionReturnRecorded {
		if err := d.repairSpec(ctx, claim, existing); err != nil {
			return nil, err
		}
		d.recordDeviceStatus(ctx, claim, existing.Devices)
		return kubeletDevices(existing.Devices), nil
	}
	if action == claimstate.ActionRollbackThenPrepare {
		// Before planning: a plan reads the hardware's state (a VFIO plan
		// records each function's driver as the one to give it back to),
		// and a half-done preparation is not the state to plan from.
		klog.FromContext(ctx).Info("Rolling back an interrupted preparation before preparing again", "startedAt", existing.StartedAt)
		if err := d.rollBack(ctx, existing, false); err != nil {
			return nil, err
		}
	}
	node := d.current()
	plan, err := d.planClaim(ctx, claim, intent, node)
	if err != nil {
		return nil, err
	}
	if existing != nil && existing.Adopted {
		// Instances an adopted record holds may serve running containers:
		// use them rather than create them again.
		plan.reuse = adoptedInstances(plan.node.inv, existing)
		plan.previous = existing
	}
	if err := d.execute(ctx, plan); err != nil {
		return nil, err
	}
	d.recordDeviceStatus(ctx, claim, plan.intent.Devices)
	return kubeletDevices(plan.intent.Devices), nil
}

// recordDeviceStatus writes the claim's status.devices entries (KEP-4817)
// when it holds dynamic MIG devices, whose UUIDs exist only now and are
// published nowhere else; other devices carry theirs as a slice attribute,
// so a claim without dynamic MIG costs no extra API write. A failure is
// logged, not returned: the status serves monitoring, and an API server or
// RBAC without it must not keep pods from starting.
func (d *Driver) recordDeviceStatus(ctx context.Context, claim *resourceapi.ResourceClaim, devices []claimstate.Device) {
	if !hasDynamicMIG(devices) {
		return
	}
	statuses := make([]devicestatus.Device, 0, len(devices))
	seen := map[string]bool{}
	for _, cd := range devices {
		key := cd.Name + "@" + cd.ShareID
		if seen[key] {
			continue
		}
		seen[key] = true
		statuses = append(statuses, devicestatus.Device{Pool: cd.Pool, Name: cd.Name, ShareID: cd.ShareID, UUID: cd.UUID, ParentUUID: cd.ParentUUID})
	}
	if err := d.status.Record(ctx, claim, statuses); err != nil {
		klog.FromContext(ctx).Error(err, "Writing the claim's device status (status.devices); the devices are prepared all the same")
	}
}

// adoptedInstances maps the dynamic MIG devices of an adopted record to the
// instances that exist for them.
func adoptedInstances(inv *hardware.Inventory, c *claimstate.Claim) map[placementKey]*hardware.MIGDevice {
	reuse := map[placementKey]*hardware.MIGDevice{}
	for i := range c.Devices {
		cd := &c.Devices[i]
		if cd.DynamicMIG == nil {
			continue
		}
		if m := instanceAt(inv, recordKey(cd)); m != nil && (cd.UUID == "" || cd.UUID == m.UUID) {
			reuse[recordKey(cd)] = m
		}
	}
	return reuse
}

// execute carries out a plan: create the dynamic MIG devices, write the CDI
// spec, record completion. On failure it undoes what it did.
//
// A claim without dynamic MIG devices gets no start record. It would cost
// a checkpoint write per claim, and nothing needs it: the per-claim CDI spec
// is named after the claim UID, so it can always be found again, and specs
// without a completed record are removed at start and by the sweep. A MIG
// device, though, is created only after a start record names its
// placement, so that gpudra never holds an instance no record owns.
func (d *Driver) execute(ctx context.Context, plan *claimPlan) (finalErr error) {
	uid := plan.intent.UID
	var created map[string]*hardware.MIGDevice
	var edits map[int]*cdispec.ContainerEdits
	var switches []modeSwitch
	if d.migSwitcher != nil {
		switches = modeSwitches(plan)
	}
	if hasDynamicMIG(plan.intent.Devices) || len(switches) > 0 || hasSharing(plan.intent.Devices) || hasVFIO(plan.intent.Devices) {
		// The start record also claims the GPUs before their mode changes,
		// and names the time slices and the MPS daemon before they exist.
		startedAt := d.now()
		if recorded, err := d.recordStart(ctx, plan, startedAt); err != nil {
			if recorded {
				err = errors.Join(err, d.abandon(ctx, plan, startedAt, nil))
			}
			return err
		}
		if len(switches) > 0 {
			if err := d.switchMIGModes(ctx, plan, switches); err != nil {
				return errors.Join(err, d.abandon(ctx, plan, startedAt, nil))
			}
		}
		var err error
		if created, err = d.setUpMIG(ctx, &plan.intent, plan.reuse); err != nil {
			return errors.Join(err, d.abandon(ctx, plan, startedAt, nil))
		}
		defer func() {
			if finalErr != nil {
				finalErr = errors.Join(finalErr, d.abandon(ctx, plan, startedAt, created))
			}
		}()
		if err := d.bindVFIO(ctx, &plan.intent); err != nil {
			return err
		}
		vfioEdits, err := d.vfioEdits(plan)
		if err != nil {
			return err
		}
		edits = vfioEdits
		if plan.sharing.daemon != nil {
			// After the MIG devices exist: the daemon serves them by UUID.
			mpsEdits, err := d.startMPS(ctx, plan.sharing.daemon, &plan.intent)
			if err != nil {
				return fmt.Errorf("start the claim's MPS daemon: %w", err)
			}
			edits = mergeEdits(edits, mpsEdits)
		}
	}
	if err := d.fault(StepWriteCDISpec, uid); err != nil {
		return err
	}
	defer func() {
		if finalErr == nil {
			return
		}
		// A failed write may have left the file behind; remove it either way.
		if err := d.cdi.Remove(uid); err != nil {
			finalErr = errors.Join(finalErr, fmt.Errorf("roll back: %w", err))
		}
	}()
	spec, err := d.specFor(plan, created, edits)
	if err != nil {
		return err
	}
	if err := d.cdi.Write(uid, spec); err != nil {
		return err
	}
	if err := d.fault(StepRecordCompleted, uid); err != nil {
		return err
	}
	now := d.now()
	if err := d.store.Update(ctx, func(s *claimstate.State) error { return s.RecordCompleted(plan.intent, now) }); err != nil {
		var conflict *claimstate.ConflictError
		if errors.As(err, &conflict) {
			return err
		}
		return fmt.Errorf("record completion in checkpoint: %w", err)
	}
	return nil
}

// recordStart records the start of a preparation and sets the claim's time
// slices, under the locks of their GPUs; recorded says whether the start
// record was written (and so must be abandoned on error). A time slice
// that another claim holds with another interval is refused before
// anything is recorded.
func (d *Driver) recordStart(ctx context.Context, plan *claimPlan, startedAt time.Time) (recorded bool, _ error) {
	claim := &claimstate.Claim{UID: plan.intent.UID, Devices: plan.intent.Devices}
	unlock := d.lockTimeSlices(claim)
	defer unlock()
	err := d.store.Update(ctx, func(s *claimstate.State) error {
		if err := checkTimeSlices(s, plan.intent); err != nil {
			return err
		}
		if err := checkMPSConsumers(s, plan.intent); err != nil {
			return err
		}
		return s.RecordStarted(plan.intent, startedAt)
	})
	if err != nil {
		var conflict *claimstate.ConflictError
		var tsConflict *timeslice.ConflictError
		if errors.As(err, &conflict) || errors.As(err, &tsConflict) || errors.Is(err, errMPSConsumer) {
			return false, err
		}
		return false, fmt.Errorf("record start in checkpoint: %w", err)
	}
	if len(timeSliceHolds(claim)) > 0 {
		if err := d.setTimeSlices(ctx, claim); err != nil {
			return true, err
		}
	}
	return true, nil
}

// abandon undoes a preparation that recorded its start: it destroys the MIG
// devices created for it (not those reused from an adopted record, which
// may serve running containers) and then drops the start record, or puts
// the adopted record back. If destroying fails, the start record stays, so
// that the next Prepare, Unprepare or sweep tries again.
func (d *Driver) abandon(ctx context.Context, plan *claimPlan, startedAt time.Time, created map[string]*hardware.MIGDevice) error {
	var mine []*claimstate.Device
	for i := range plan.intent.Devices {
		cd := &plan.intent.Devices[i]
		if cd.DynamicMIG != nil && plan.reuse[recordKey(cd)] == nil && (created == nil || created[cd.Name] != nil) {
			mine = append(mine, cd)
		}
	}
	started := &claimstate.Claim{UID: plan.intent.UID, Devices: plan.intent.Devices}
	if err := d.tearDownSharing(ctx, started); err != nil {
		return fmt.Errorf("roll back (kept the start record; retried later): %w", err)
	}
	if err := d.restoreVFIO(ctx, started); err != nil {
		return fmt.Errorf("roll back (kept the start record; retried later): %w", err)
	}
	if created != nil {
		if err := d.tearDownMIG(ctx, mine); err != nil {
			return fmt.Errorf("roll back (kept the start record; retried later): %w", err)
		}
	}
	err := d.store.Update(ctx, func(s *claimstate.State) error {
		if c := s.Claims[plan.intent.UID]; c != nil && c.Phase == claimstate.PrepareStarted && c.StartedAt.Equal(startedAt) {
			if plan.previous != nil {
				s.Claims[plan.intent.UID] = plan.previous.Clone()
			} else {
				s.Remove(plan.intent.UID)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("roll back: drop the start record: %w", err)
	}
	return nil
}

// rollBack undoes the work of a (partial) preparation: the MIG devices its
// record owns, the CDI spec and, when forget is set, the claim's record.
// Nothing after a failed step is undone, so the record keeps owning what
// is left and a retry finishes the job.
func (d *Driver) rollBack(ctx context.Context, c *claimstate.Claim, forget bool) error {
	if err := d.tearDownRecord(ctx, c); err != nil {
		return err
	}
	if err := d.cdi.Remove(c.UID); err != nil {
		return err
	}
	if !forget {
		return nil
	}
	return d.store.Update(ctx, func(s *claimstate.State) error {
		s.Remove(c.UID)
		return nil
	})
}

func (d *Driver) unprepareClaim(ctx context.Context, claim kubeletplugin.NamespacedObject) error {
	uid := string(claim.UID)
	logger := klog.FromContext(ctx).WithValues("claim", claim.NamespacedName, "claimUID", uid)
	d.claimLocks.LockKey(uid)
	defer func() { _ = d.claimLocks.UnlockKey(uid) }()

	var record *claimstate.Claim
	err := d.store.View(ctx, func(s *claimstate.State) error {
		if c := s.Claims[uid]; c != nil {
			record = c.Clone()
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("unprepare claim %s: read checkpoint: %w", claim.NamespacedName, err)
	}
	if record == nil {
		// Unknown claim: nothing recorded, but a crash between writing the
		// spec and recording completion can leave a spec behind.
		if err := d.cdi.Remove(uid); err != nil {
			return fmt.Errorf("unprepare claim %s: %w", claim.NamespacedName, err)
		}
		logger.V(2).Info("Unprepare of a claim that is not prepared here; nothing to do")
		return nil
	}
	if err := d.rollBack(ctx, record, true); err != nil {
		return fmt.Errorf("unprepare claim %s: %w", claim.NamespacedName, err)
	}
	if hasDynamicMIG(record.Devices) {
		// The claim usually outlives its pods a moment; drop the UUIDs of
		// MIG devices that no longer exist. Gone claims need nothing.
		if err := d.status.Remove(ctx, claim); err != nil {
			logger.Error(err, "Removing the claim's device status (status.devices)")
		}
	}
	logger.V(2).Info("Unprepared", "devices", len(record.Devices))
	return nil
}

// claimPlan is everything needed to prepare one claim, worked out before
// any side effect.
type claimPlan struct {
	intent claimstate.Intent
	// node is the discovery result the plan was made against, devices the
	// model devices of intent.Devices (same order).
	node    *nodeState
	devices []*devicemodel.Device
	common  *cdispec.ContainerEdits
	// sharing is how the devices are shared (time-slicing, MPS).
	sharing *sharingPlan
	// configs are the devices' resolved configs (same order).
	configs []v1beta1.Config
	// reuse and previous are set when preparing over an adopted record:
	// its existing MIG instances, and the record to restore on failure.
	reuse    map[placementKey]*hardware.MIGDevice
	previous *claimstate.Claim
}

// intentOf reads what the claim asks of this driver from its allocation:
// the consumer pods and the devices with their CDI IDs.
func (d *Driver) intentOf(claim *resourceapi.ResourceClaim) (claimstate.Intent, error) {
	intent := claimstate.Intent{UID: string(claim.UID), Namespace: claim.Namespace, Name: claim.Name}
	if claim.Status.Allocation == nil {
		return intent, fmt.Errorf("claim is not allocated")
	}
	intent.Consumers = consumersOf(claim)
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != d.cfg.DriverName {
			continue
		}
		if r.Pool != d.cfg.NodeName {
			return intent, fmt.Errorf("request %s: device %s is from pool %q, but this node's pool is %q", r.Request, r.Device, r.Pool, d.cfg.NodeName)
		}
		cd := claimstate.Device{
			Requests:    []string{r.Request},
			Pool:        r.Pool,
			Name:        r.Device,
			AdminAccess: r.AdminAccess != nil && *r.AdminAccess,
		}
		if r.ShareID != nil {
			cd.ShareID = string(*r.ShareID)
		}
		cd.CDIDeviceIDs = []string{cdi.DeviceID(d.cfg.DriverName, string(claim.UID), cdi.ShareName(r.Device, cd.ShareID))}
		intent.Devices = append(intent.Devices, cd)
	}
	return intent, nil
}

// repairSpec writes the CDI spec of a prepared claim again if it went
// missing (someone cleaned /var/run/cdi): the kubelet asks again exactly
// when a container of the claim is about to start and needs it.
func (d *Driver) repairSpec(ctx context.Context, claim *resourceapi.ResourceClaim, record *claimstate.Claim) error {
	if d.cdi.Exists(record.UID) {
		return nil
	}
	klog.FromContext(ctx).Info("CDI spec of a prepared claim is missing; writing it again")
	intent := claimstate.Intent{UID: record.UID, Namespace: record.Namespace, Name: record.Name, Devices: record.Clone().Devices}
	plan, err := d.planClaim(ctx, claim, intent, d.current())
	if err != nil {
		return fmt.Errorf("write the missing CDI spec again: %w", err)
	}
	created := map[string]*hardware.MIGDevice{}
	for _, cd := range record.Devices {
		if cd.DynamicMIG == nil {
			continue
		}
		_, m := migDeviceByUUID(plan.node.inv, cd.UUID)
		if m == nil {
			return fmt.Errorf("write the missing CDI spec again: MIG device %s (%s) of the claim no longer exists", cd.Name, cd.UUID)
		}
		created[cd.Name] = m
	}
	edits, err := d.mpsEdits(record)
	if err != nil {
		return fmt.Errorf("write the missing CDI spec again: %w", err)
	}
	vfioEdits, err := d.vfioEdits(plan)
	if err != nil {
		return fmt.Errorf("write the missing CDI spec again: %w", err)
	}
	edits = mergeEdits(vfioEdits, edits)
	spec, err := d.specFor(plan, created, edits)
	if err != nil {
		return fmt.Errorf("write the missing CDI spec again: %w", err)
	}
	return d.cdi.Write(record.UID, spec)
}

// specFor builds the claim's CDI spec; created holds the MIG devices made
// for its dynamic MIG devices, by device name, and edits the MPS edits of
// its devices, by index in the intent.
func (d *Driver) specFor(plan *claimPlan, created map[string]*hardware.MIGDevice, edits map[int]*cdispec.ContainerEdits) (*cdispec.Spec, error) {
	devices := make([]cdi.SpecDevice, 0, len(plan.devices))
	seen := map[string]bool{}
	for i, dev := range plan.devices {
		shareID := plan.intent.Devices[i].ShareID
		// One device allocated for two requests (admin access) needs one
		// CDI device; each share gets its own.
		if name := cdi.ShareName(dev.Name(), shareID); seen[name] {
			continue
		} else {
			seen[name] = true
		}
		if dev.Placement != nil {
			m := created[dev.Name()]
			if m == nil {
				return nil, fmt.Errorf("device %s: MIG device was not created", dev.Name())
			}
			withMIG := *dev
			withMIG.MIG = m
			dev = &withMIG
		}
		devices = append(devices, cdi.SpecDevice{Device: dev, ShareID: shareID, Edits: edits[i]})
	}
	return cdi.BuildSpec(cdi.SpecInput{
		DriverName: d.cfg.DriverName,
		ClaimUID:   plan.intent.UID,
		Majors:     plan.node.inv.Majors,
		Devices:    devices,
		Common:     plan.common,
	})
}

// planClaim checks the intent against this node's devices, resolves the
// claim's configuration and gathers what its CDI spec needs. It has no side effects,
// except that it discovers the GPUs again when the nvidia-uvm module was
// not loaded at the last discovery.
func (d *Driver) planClaim(ctx context.Context, claim *resourceapi.ResourceClaim, intent claimstate.Intent, node *nodeState) (*claimPlan, error) {
	vfioOnly := !slices.ContainsFunc(intent.Devices, func(cd claimstate.Device) bool {
		dev, ok := node.model.Lookup(cd.Name)
		return !ok || dev.Kind != devicemodel.KindVFIO
	})
	if node.inv.Majors.UVM == 0 && len(node.inv.GPUs) > 0 && !vfioOnly {
		// nvidia-uvm loads lazily on hosts with a host-installed driver;
		// its major may exist by now.
		if err := d.discover(ctx); err == nil {
			node = d.current()
		}
		if node.inv.Majors.UVM == 0 {
			return nil, fmt.Errorf("the nvidia-uvm kernel module is not loaded (no nvidia-uvm in /proc/devices), and CUDA containers need /dev/nvidia-uvm: load it on the node (modprobe nvidia-uvm, or nvidia-ctk system create-device-nodes --control-devices --load-kernel-modules)")
		}
	}
	devices := make([]*devicemodel.Device, 0, len(intent.Devices))
	for i := range intent.Devices {
		cd := &intent.Devices[i]
		dev, ok := node.model.Lookup(cd.Name)
		if !ok {
			return nil, fmt.Errorf("request %s: device %s is not a device of node %s (it has %d devices)", cd.Requests[0], cd.Name, d.cfg.NodeName, len(node.model.Devices))
		}
		devices = append(devices, dev)
		switch {
		case dev.Kind == devicemodel.KindVFIO:
			cd.UUID = dev.GPU.UUID
			// A record's own passthrough (repairing a prepared claim's
			// spec) stands; only a new preparation plans one.
			if cd.VFIO == nil {
				if err := d.planVFIO(cd, dev); err != nil {
					return nil, err
				}
			}
		case dev.Placement != nil:
			// Created at Prepare: its UUID is known only then.
			cd.UUID, cd.ParentUUID = "", dev.GPU.UUID
			cd.DynamicMIG = dynamicRecord(dev)
		case dev.MIG != nil:
			cd.UUID, cd.ParentUUID = dev.UUID(), dev.GPU.UUID
		default:
			cd.UUID = dev.UUID()
		}
	}
	resolved, err := d.resolveConfigs(claim, node)
	if err != nil {
		return nil, err
	}
	sharing, err := d.planSharing(&intent, resolved, devices)
	if err != nil {
		return nil, err
	}
	common, err := d.cfg.DriverEdits.CommonEdits(ctx, node.inv.DriverVersion)
	if err != nil {
		return nil, fmt.Errorf("driver files for CDI: %w", err)
	}
	plan := &claimPlan{intent: intent, node: node, devices: devices, common: common, sharing: sharing}
	for _, rd := range resolved {
		plan.configs = append(plan.configs, rd.Config)
	}
	if !hasDynamicMIG(intent.Devices) && !hasVFIO(intent.Devices) {
		// Catch what would make the spec fail before anything is set up.
		if _, err := d.specFor(plan, nil, nil); err != nil {
			return nil, err
		}
	}
	return plan, nil
}

func kubeletDevices(devices []claimstate.Device) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(devices))
	for _, d := range devices {
		kd := kubeletplugin.Device{
			Requests:     d.Requests,
			PoolName:     d.Pool,
			DeviceName:   d.Name,
			CDIDeviceIDs: d.CDIDeviceIDs,
		}
		if d.ShareID != "" {
			id := types.UID(d.ShareID)
			kd.ShareID = &id
		}
		out = append(out, kd)
	}
	return out
}

func (d *Driver) fault(step Step, claimUID string) error {
	if d.cfg.Faults == nil {
		return nil
	}
	if err := d.cfg.Faults(step, claimUID); err != nil {
		return fmt.Errorf("injected fault at %s: %w", step, err)
	}
	return nil
}

// consumersOf returns the pods a claim is reserved for.
func consumersOf(claim *resourceapi.ResourceClaim) []claimstate.Consumer {
	var out []claimstate.Consumer
	for _, ref := range claim.Status.ReservedFor {
		if ref.Resource == "pods" && ref.APIGroup == "" {
			out = append(out, claimstate.Consumer{Name: ref.Name, UID: string(ref.UID)})
		}
	}
	return out
}
