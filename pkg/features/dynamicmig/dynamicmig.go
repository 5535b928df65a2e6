// Package dynamicmig is the configurator of MIG devices created on demand
// (dynamic MIG): every profile at every placement of a GPU in MIG mode is
// published with shared counters, and the MIG device a claim was allocated
// is created at Prepare and destroyed at Unprepare. Its record names each
// placement before the instance is created, so that gpudra never holds an
// instance no record owns; a GPU holding instances of unknown ownership is
// left out of the published devices, never touched.
package dynamicmig

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/devicestatus"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// Name is the configurator's record name in the checkpoint.
const Name = "dynamicMIG"

// Record is what the configurator keeps per claim.
type Record struct {
	Devices []Instance `json:"devices"`
}

// Instance is one MIG device of a claim: where it goes and, once created,
// what it is.
type Instance struct {
	// Device is the published device name.
	Device string `json:"device"`
	// ParentUUID is the GPU's UUID.
	ParentUUID string `json:"parentUUID"`
	// Profile is the GPU instance profile's name, for logs ("1g.10gb").
	Profile string `json:"profile"`
	// ProfileID is the profile's own ID (nvidia-smi mig -lgip "ID").
	ProfileID int `json:"profileID"`
	// Start and Size are the placement in memory slices.
	Start int `json:"start"`
	Size  int `json:"size"`
	// UUID, GIID and CIID are set once the instance exists.
	UUID string `json:"uuid,omitempty"`
	GIID int    `json:"giID,omitempty"`
	CIID int    `json:"ciID,omitempty"`
}

func (in *Instance) placement() hardware.MIGPlacement {
	return hardware.MIGPlacement{ParentUUID: in.ParentUUID, ProfileID: in.ProfileID, Start: in.Start}
}

func (in *Instance) overlaps(o *Instance) bool {
	return in.ParentUUID == o.ParentUUID && in.Start < o.Start+o.Size && o.Start < in.Start+in.Size
}

func (in *Instance) String() string {
	return fmt.Sprintf("%s (%s at placement %d on GPU %s)", in.Device, in.Profile, in.Start, in.ParentUUID)
}

// Configurator creates and destroys the MIG devices of claims.
type Configurator struct {
	mig hardware.MIGManager
	// dynamic says whether the node publishes dynamic MIG devices now. In
	// static mode the MIG devices are an operator's, named like dynamic
	// ones: adoption must never take them for gpudra's.
	dynamic func() bool
}

var (
	_ preparer.Feature[Record]         = &Configurator{}
	_ preparer.FeatureGuard[Record]    = &Configurator{}
	_ preparer.FeatureEditor[Record]   = &Configurator{}
	_ preparer.Adopter                 = &Configurator{}
	_ preparer.StatusReporter          = &Configurator{}
	_ preparer.FeatureChecker[Record]  = &Configurator{}
	_ preparer.FeatureMetadata[Record] = &Configurator{}
)

// codec reads the records of the other claims and writes those Adopt
// finds.
var codec = preparer.Codec[Record]{Name: Name}

// New returns the configurator; mig nil means the hardware cannot create
// MIG devices (static MIG only): claims of dynamic MIG devices are then
// refused, and records of earlier ones cannot be undone. dynamic says
// whether dynamic MIG devices are published now (see [Publisher.Dynamic]).
func New(mig hardware.MIGManager, dynamic func() bool) *Configurator {
	return &Configurator{mig: mig, dynamic: dynamic}
}

// Name implements [preparer.Feature].
func (c *Configurator) Name() string { return Name }

// ReportsDeviceStatus implements [preparer.StatusReporter]: a created MIG
// device's UUID exists only from Prepare on and is published nowhere else.
func (c *Configurator) ReportsDeviceStatus() bool { return true }

// Plan implements [preparer.Feature]: one instance per dynamic MIG
// device of the claim (a device allocated for two requests is one).
func (c *Configurator) Plan(_ context.Context, cl *preparer.Claim) (*Record, error) {
	var rec Record
	for _, d := range cl.Devices {
		p := d.Model.Placement
		if p == nil || slices.ContainsFunc(rec.Devices, func(in Instance) bool { return in.Device == d.Model.Name() }) {
			continue
		}
		if c.mig == nil {
			return nil, fmt.Errorf("device %s: this node cannot create MIG devices (static MIG)", d.Model.Name())
		}
		rec.Devices = append(rec.Devices, Instance{
			Device: d.Model.Name(), ParentUUID: d.Model.GPU.UUID,
			Profile: p.Profile.Name, ProfileID: p.Profile.ProfileID, Start: p.Start, Size: p.Profile.PlacementSize,
		})
	}
	if len(rec.Devices) == 0 {
		return nil, nil
	}
	return &rec, nil
}

// Guard implements [preparer.FeatureGuard]: no placement of the claim overlaps an
// instance another claim holds or is about to create.
func (c *Configurator) Guard(s *claimstate.State, claim *claimstate.Claim, rec *Record) error {
	for _, uid := range slices.Sorted(maps.Keys(s.Claims)) {
		other := s.Claims[uid]
		if uid == claim.UID {
			continue
		}
		held, err := codec.Of(other)
		if err != nil {
			return err
		}
		if held == nil {
			continue
		}
		for i := range rec.Devices {
			for j := range held.Devices {
				if rec.Devices[i].overlaps(&held.Devices[j]) {
					return &claimstate.ConflictError{Device: claim.Devices[0].Pool + "/" + rec.Devices[i].Device, Holder: other}
				}
			}
		}
	}
	return nil
}

// Apply implements [preparer.Feature]: it creates the instances in
// order. On failure the preparer undoes the whole record (destroying an
// instance that does not exist is a no-op).
func (c *Configurator) Apply(ctx context.Context, cl *preparer.Claim, rec *Record) (*Record, error) {
	if c.mig == nil {
		return nil, errors.New("this node cannot create MIG devices (static MIG)")
	}
	for i := range rec.Devices {
		in := &rec.Devices[i]
		if in.UUID != "" {
			continue
		}
		m, err := c.mig.CreateMIGDevice(ctx, in.placement())
		if err != nil {
			return nil, fmt.Errorf("create MIG device %s: %w", in, err)
		}
		in.UUID, in.GIID, in.CIID = m.UUID, m.GIID, m.CIID
		fill(cl, in, &m)
	}
	return rec, nil
}

// Edits implements [preparer.FeatureEditor]: the claim's devices become the MIG
// devices its record says were created.
func (c *Configurator) Edits(_ context.Context, cl *preparer.Claim, rec *Record) error {
	for i := range rec.Devices {
		in := &rec.Devices[i]
		m := cl.Inventory.MIGDevice(in.UUID)
		if in.UUID == "" || m == nil {
			return fmt.Errorf("MIG device %s (%s) of the claim no longer exists", in.Device, in.UUID)
		}
		fill(cl, in, m)
	}
	return nil
}

// fill points the claim's entries of the instance's device at the created
// MIG device.
func fill(cl *preparer.Claim, in *Instance, m *hardware.MIGDevice) {
	for _, d := range cl.Devices {
		if d.Model.Name() != in.Device {
			continue
		}
		withMIG := *d.Model
		mig := *m
		withMIG.MIG = &mig
		d.Model = &withMIG
		d.State.UUID, d.State.ParentUUID = m.UUID, in.ParentUUID
	}
}

// Undo implements [preparer.Feature]: it destroys every instance the
// record names, all of them even if one fails.
func (c *Configurator) Undo(ctx context.Context, _ string, rec *Record) error {
	if c.mig == nil {
		return errors.New("the claim holds MIG devices created on demand, but this node cannot destroy MIG devices now (static MIG); destroy them by hand or run the plugin in dynamic MIG mode")
	}
	var errs []error
	for i := range rec.Devices {
		in := &rec.Devices[i]
		if err := c.mig.DestroyMIGDevice(ctx, in.placement()); err != nil {
			errs = append(errs, fmt.Errorf("destroy MIG device %s: %w", in, err))
		}
	}
	return errors.Join(errs...)
}

// Adopt implements [preparer.Adopter]. After the checkpoint was lost, an
// existing instance is gpudra's when a claim names the dynamic MIG device
// at exactly its profile and placement and says it was created for it: a
// claim adopted from the CDI spec of an older plugin (one without device
// identities or records, written when GPUs holding foreign instances were
// not published), or a claim the API server allocated from this node
// whose status.devices names the instance's UUID (written only for MIG
// devices created on demand). The claim then holds the instance, unless
// another claim's record owns it already. Since an operator's MIG device
// is published under the very name of the placement it occupies, a claim
// merely naming the device proves nothing: a newer spec without this
// configurator's record, or an allocated claim without that status, used
// the instance as a static MIG device. Anything else stays unknown: kept,
// never destroyed, and published as a static MIG device.
func (c *Configurator) Adopt(_ context.Context, a *preparer.Adoption) error {
	if a.Inventory == nil || c.mig == nil || !c.dynamic() {
		return nil
	}
	full, err := devicemodel.Build(a.Inventory, devicemodel.WithDynamicMIG())
	if err != nil {
		return fmt.Errorf("build device model: %w", err)
	}
	// An instance has at most one owner. What the node itself recorded
	// (the records the claims' CDI specs carry) comes first; a claim that
	// names an instance someone already owns, such as one the scheduler
	// allocated the device to again after the checkpoint was lost, does
	// not become its second owner: its Unprepare would destroy the
	// instance in use.
	var owned []Instance
	for _, uid := range slices.Sorted(maps.Keys(a.Claims)) {
		rec, err := codec.Of(a.Claims[uid])
		if err != nil {
			return fmt.Errorf("claim %s: %w", uid, err)
		}
		if rec != nil {
			owned = append(owned, rec.Devices...)
		}
	}
	taken := func(in *Instance) bool {
		return slices.ContainsFunc(owned, func(o Instance) bool { return o.overlaps(in) })
	}
	// created says whether the claim's evidence names instance m as
	// created for device i.
	instances := func(devices []claimstate.Device, created func(i int, m *hardware.MIGDevice) bool) []Instance {
		var out []Instance
		for i := range devices {
			dev, ok := full.Lookup(devices[i].Name)
			if !ok || dev.Placement == nil {
				continue
			}
			in := Instance{Device: dev.Name(), ParentUUID: dev.GPU.UUID, Profile: dev.Placement.Profile.Name,
				ProfileID: dev.Placement.Profile.ProfileID, Start: dev.Placement.Start, Size: dev.Placement.Profile.PlacementSize}
			m := instanceAt(a.Inventory, in.placement())
			if m == nil || !created(i, m) || taken(&in) || slices.ContainsFunc(out, func(o Instance) bool { return o.Device == in.Device }) {
				continue
			}
			in.UUID, in.GIID, in.CIID = m.UUID, m.GIID, m.CIID
			devices[i].UUID, devices[i].ParentUUID = m.UUID, in.ParentUUID
			out = append(out, in)
		}
		owned = append(owned, out...)
		return out
	}
	for _, uid := range slices.Sorted(maps.Keys(a.Claims)) {
		cl := a.Claims[uid]
		if cl.Records[Name] != nil {
			continue
		}
		// A spec that names its devices' identities was written by a
		// plugin that records its instances in the spec.
		olderSpec := func(i int, _ *hardware.MIGDevice) bool { return cl.Devices[i].UUID == "" }
		if found := instances(cl.Devices, olderSpec); len(found) > 0 {
			if err := setRecord(cl, found); err != nil {
				return err
			}
		}
	}
	for _, alloc := range a.Allocated {
		uid := alloc.Intent.UID
		if a.Claims[uid] != nil {
			continue
		}
		devices := slices.Clone(alloc.Intent.Devices)
		found := instances(devices, func(i int, m *hardware.MIGDevice) bool { return reportedCreated(alloc.Claim, &devices[i], m) })
		if len(found) == 0 {
			continue
		}
		cl := &claimstate.Claim{UID: uid, Namespace: alloc.Intent.Namespace, Name: alloc.Intent.Name,
			Phase: claimstate.PrepareCompleted, Consumers: alloc.Intent.Consumers, Devices: devices, Adopted: true}
		if err := setRecord(cl, found); err != nil {
			return err
		}
		a.Claims[uid] = cl
	}
	return nil
}

// Check implements [preparer.FeatureChecker]: every instance the record names
// still exists. One destroyed while the checkpoint was lost (the sweep
// undid another owner) makes the adopted claim be prepared again.
func (c *Configurator) Check(_ context.Context, rec *Record, inv *hardware.Inventory) error {
	for i := range rec.Devices {
		in := &rec.Devices[i]
		if in.UUID == "" || inv.MIGDevice(in.UUID) == nil {
			return fmt.Errorf("MIG device %s (UUID %q) no longer exists", in, in.UUID)
		}
	}
	return nil
}

// reportedCreated says whether the claim's status.devices reports MIG
// device m as device d of the claim: gpudra writes such an entry only for
// a MIG device it created for the claim.
func reportedCreated(claim *resourceapi.ResourceClaim, d *claimstate.Device, m *hardware.MIGDevice) bool {
	if claim == nil {
		return false
	}
	for i := range claim.Status.Devices {
		e := &claim.Status.Devices[i]
		if e.Pool != d.Pool || e.Device != d.Name || e.Data == nil {
			continue
		}
		if data, err := devicestatus.DecodeData(e.Data); err == nil && data.UUID == m.UUID {
			return true
		}
	}
	return false
}

func setRecord(cl *claimstate.Claim, found []Instance) error {
	return codec.Set(cl, &Record{Devices: found})
}

// instanceAt finds the MIG device at a placement in the inventory.
func instanceAt(inv *hardware.Inventory, p hardware.MIGPlacement) *hardware.MIGDevice {
	for gi := range inv.GPUs {
		gpu := &inv.GPUs[gi]
		if gpu.UUID != p.ParentUUID {
			continue
		}
		for mi := range gpu.MIGDevices {
			if m := &gpu.MIGDevices[mi]; m.ProfileID == p.ProfileID && m.PlacementStart == p.Start {
				return m
			}
		}
	}
	return nil
}
