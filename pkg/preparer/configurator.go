// Package preparer prepares and unprepares claims on a node without
// knowing any device feature. Each feature (see package features) is a
// [Configurator] in a package of its own; the preparer runs the
// claim state machine (package claimstate) through them: it asks each to
// plan, records the start of the preparation when any planned something,
// applies them in order, writes the claim's CDI spec, records completion,
// and on failure undoes what was applied in reverse order. Each
// configurator owns its record in the checkpoint (claimstate.Claim.Records,
// keyed by its name), so adding a feature adds a package and a line that
// registers it, not branches across the plugin.
package preparer

import (
	"context"
	"encoding/json"

	resourceapi "k8s.io/api/resource/v1"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/pkg/claimconfig"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// Configurator sets up one device feature for the claims that need it.
//
// The preparer calls Plan for every claim it prepares, in registration
// order; a configurator with nothing to do returns a nil record. For a
// claim with records it then writes a start record naming them all, calls
// Apply of each in order and, if one fails, Undo of those applied before it
// in reverse order. Undo is also what Unprepare, the sweep and a retried
// Prepare after a crash call, with whatever the checkpoint holds: it must
// be idempotent and safe on work that was half done or never started.
type Configurator interface {
	// Name is the key of the configurator's record in the checkpoint. It
	// never changes once released: a checkpoint names the records a
	// reader must understand.
	Name() string
	// Plan decides what the claim needs of this feature and returns it as
	// the record to write before anything is set up, or nil. It may read
	// the hardware (sysfs) but changes nothing. It fills in what it alone
	// knows of the claim's devices (their UUIDs, say) and may refuse the
	// claim, naming the config field and the values allowed.
	Plan(ctx context.Context, c *Claim) (json.RawMessage, error)
	// Apply sets up what the record says and returns the record as done
	// (what was created, with its IDs), which replaces it in the
	// checkpoint at completion. It adds the CDI edits of the claim's
	// devices (Device.Edits, Device.Model) and must be idempotent.
	Apply(ctx context.Context, c *Claim, rec json.RawMessage) (json.RawMessage, error)
	// Undo takes down what the record says was (or was about to be) set
	// up for the claim with the given UID. It is idempotent; the record is
	// dropped only once it succeeded, so a failure is retried later.
	Undo(ctx context.Context, claimUID string, rec json.RawMessage) error
}

// Guard is implemented by configurators that must check a record against
// the other claims' records atomically with recording it: Guard runs inside
// the checkpoint transaction that writes the start record, so of two
// claims that cannot both hold something, exactly one is refused. It must
// be quick and do no I/O.
type Guard interface {
	Guard(s *claimstate.State, c *claimstate.Claim, rec json.RawMessage) error
}

// Editor is implemented by configurators whose completed record changes
// the claim's CDI spec. Edits fills in the claim's devices from the record
// without touching the hardware; the preparer calls it to write the spec
// of a prepared claim again when it went missing.
type Editor interface {
	Edits(ctx context.Context, c *Claim, rec json.RawMessage) error
}

// Restorer is implemented by configurators whose setup does not outlive
// the plugin on its own (a daemon to supervise, a setting lost when the
// driver reloads). Restore runs once at start with every completed claim
// that holds a record of the configurator.
type Restorer interface {
	Restore(ctx context.Context, claims []*claimstate.Claim) error
}

// Cleaner is implemented by configurators that keep files of their own.
// CleanUp runs once at start, before Restore, and removes what a killed
// plugin left half-done (the temp files of atomic writes), under the
// configurator's own lock.
type Cleaner interface {
	CleanUp(ctx context.Context) error
}

// Adopter is implemented by configurators that can find their work on the
// node after the checkpoint was lost. Adopt gets the claims adopted so far
// (from their CDI specs, with the records the specs carried) by UID; it may
// add its records to them, and add claims it finds elsewhere (the API
// server's allocations). It must never claim what it cannot prove is
// gpudra's.
type Adopter interface {
	Adopt(ctx context.Context, in *Adoption) error
}

// Checker is implemented by configurators whose setup can vanish while
// the checkpoint does not know it: after a lost checkpoint, what an
// adopted claim's record names may have been taken down since (a MIG
// device destroyed when another claim that named it was undone). Check
// returns an error naming what is gone when the completed record rec
// describes setup that inv no longer has. An adopted claim whose record
// fails Check is prepared again, not completed with a CDI spec naming a
// device that does not exist.
type Checker interface {
	Check(ctx context.Context, rec json.RawMessage, inv *hardware.Inventory) error
}

// Discoverer is implemented by a [Node] that can read the hardware afresh;
// [Checker]s then see the node as it is, not as last discovered.
type Discoverer interface {
	Discover(ctx context.Context) (*hardware.Inventory, error)
}

// StatusReporter is implemented by configurators whose devices get an
// identity only at Prepare (a device created on demand): claims that
// hold their records get status.devices entries (KEP-4817) naming it.
type StatusReporter interface {
	ReportsDeviceStatus() bool
}

// Adoption is the input and output of [Adopter.Adopt].
type Adoption struct {
	// Inventory is the node's hardware now; nil if discovery failed.
	Inventory *hardware.Inventory
	// Claims are the adopted records by claim UID.
	Claims map[string]*claimstate.Claim
	// Allocated lists the API server's claims allocated from this node's
	// pool, with their intents; nil when the API server could not be
	// asked.
	Allocated []AllocatedClaim
}

// AllocatedClaim is a claim the API server allocated from this node.
type AllocatedClaim struct {
	Claim  *resourceapi.ResourceClaim
	Intent claimstate.Intent
}

// Claim is one claim being prepared, as configurators see it.
type Claim struct {
	UID       string
	Namespace string
	Name      string
	Consumers []claimstate.Consumer
	// Devices are the claim's devices of this driver, in allocation order.
	Devices []*Device
	// Inventory is the hardware the devices were found in.
	Inventory *hardware.Inventory
}

// Device is one allocated device of a claim.
type Device struct {
	// State is the device as the checkpoint records it. Configurators set
	// its UUID and ParentUUID where they decide them.
	State *claimstate.Device
	// Model is the published device it was allocated as. A configurator
	// replaces it with what the container gets (the device it created).
	Model *devicemodel.Device
	// Config is the device's resolved opaque config, with its origin.
	Config claimconfig.Device
	// Edits are added to the device's CDI edits.
	Edits *cdispec.ContainerEdits
}

// Intent returns the claim as the state machine records it.
func (c *Claim) Intent() claimstate.Intent {
	in := claimstate.Intent{UID: c.UID, Namespace: c.Namespace, Name: c.Name, Consumers: c.Consumers}
	for _, d := range c.Devices {
		in.Devices = append(in.Devices, *d.State)
	}
	return in
}

// AddEdits appends edits to the device's CDI edits.
func (d *Device) AddEdits(e *cdispec.ContainerEdits) {
	if e == nil {
		return
	}
	if d.Edits == nil {
		copied := *e
		d.Edits = &copied
		return
	}
	merged := *d.Edits
	merged.Env = append(append([]string(nil), d.Edits.Env...), e.Env...)
	merged.DeviceNodes = append(append([]*cdispec.DeviceNode(nil), d.Edits.DeviceNodes...), e.DeviceNodes...)
	merged.Mounts = append(append([]*cdispec.Mount(nil), d.Edits.Mounts...), e.Mounts...)
	merged.Hooks = append(append([]*cdispec.Hook(nil), d.Edits.Hooks...), e.Hooks...)
	d.Edits = &merged
}

// RecordError says a record in the checkpoint cannot be read.
type RecordError struct {
	Name string
	Err  error
}

func (e *RecordError) Error() string {
	return "checkpoint record " + e.Name + " unreadable: " + e.Err.Error()
}

func (e *RecordError) Unwrap() error { return e.Err }
