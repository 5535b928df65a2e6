package preparer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/checkpoint"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// Step names a point of a preparation at which tests inject failures.
type Step string

// The preparer's own steps, in order. A configurator's steps are its Plan,
// Apply and Undo: tests fail those with a failing configurator.
const (
	StepWriteCDISpec    Step = "WriteCDISpec"
	StepRecordCompleted Step = "RecordCompleted"
)

// Node is what the preparer needs of the node's published devices; the
// kubelet-plugin shell implements it.
type Node interface {
	// Claim looks the intent's devices up among the published devices,
	// resolves the claim's opaque configs and returns the claim to prepare
	// with the CDI edits every device of it needs (driver files).
	Claim(ctx context.Context, claim *resourceapi.ResourceClaim, intent claimstate.Intent) (*Claim, *cdispec.ContainerEdits, error)
	// Allocated lists the API server's claims allocated from this node's
	// pool, for adoption; an error if the API server cannot be asked.
	Allocated(ctx context.Context) ([]AllocatedClaim, error)
	// Inventory is the node's hardware as last discovered, nil if never.
	Inventory() *hardware.Inventory
	// Model is the devices as last published, nil if never: their shared
	// counters are checked against what the node's claims hold.
	Model() *devicemodel.Model
}

// Config is what a Preparer works with.
type Config struct {
	DriverName string
	// NodeName is this node and its pool.
	NodeName string
	Store    *checkpoint.Store
	CDI      *cdi.Writer
	Node     Node
	// Configurators in the order they apply; they undo in reverse.
	Configurators []Configurator
	// Clock replaces time.Now (tests); nil means time.Now.
	Clock func() time.Time
	// Faults, if set, is called before each of the preparer's steps and
	// may fail it (tests).
	Faults func(step Step, claimUID string) error
	// DeviceMetadata fills in the metadata of every prepared device
	// (KEP-5304), which the kubelet plugin helper writes into a file each
	// container of the claim can read. Off, the devices carry none.
	DeviceMetadata bool
}

// Preparer prepares and unprepares claims through the configurators. Its
// methods are safe for concurrent use; calls for one claim are serialized.
type Preparer struct {
	cfg        Config
	claimLocks claimLocks
	// adoptMu serializes adoptions.
	adoptMu sync.Mutex
}

// New returns a Preparer.
func New(cfg Config) *Preparer {
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	return &Preparer{cfg: cfg}
}

// RecordNames are the names of the records the configurators own: what a
// checkpoint may require of its reader.
func RecordNames(cs []Configurator) []string {
	names := make([]string, 0, len(cs))
	for _, c := range cs {
		names = append(names, c.Name())
	}
	return names
}

// LockClaim takes the lock of one claim, in this process and then in the
// checkpoint's directory ([checkpoint.Store.LockClaim]): Prepare,
// Unprepare and the sweep's undo of a claim exclude each other also when
// two plugin instances share the directory (a rolling update). It waits
// until ctx ends; the returned function releases the lock.
func (p *Preparer) LockClaim(ctx context.Context, uid string) (func(), error) {
	unlock, err := p.claimLocks.lock(ctx, uid)
	if err != nil {
		return nil, fmt.Errorf("wait for the lock of claim %s: %w", uid, err)
	}
	unlockDir, err := p.cfg.Store.LockClaim(ctx, uid)
	if err != nil {
		unlock()
		return nil, fmt.Errorf("wait for the lock of claim %s (another plugin instance may hold it): %w", uid, err)
	}
	return func() {
		unlockDir()
		unlock()
	}, nil
}

// Prepared is the outcome of a Prepare.
type Prepared struct {
	// Devices are what the kubelet gets.
	Devices []kubeletplugin.Device
	// Record is the claim's completed record; nil for a claim with no
	// device of this driver.
	Record *claimstate.Claim
}

// Prepare prepares one claim and returns what the kubelet gets. A claim
// prepared before is answered from its record before anything else is
// looked at, so a retry succeeds even if the node's devices changed since.
func (p *Preparer) Prepare(ctx context.Context, claim *resourceapi.ResourceClaim) (Prepared, error) {
	out, err := p.prepare(ctx, claim)
	if err != nil {
		return Prepared{}, err
	}
	if out == nil {
		// Nothing of ours in this claim: nothing to set up or record.
		return Prepared{Devices: []kubeletplugin.Device{}}, nil
	}
	return Prepared{Devices: p.kubeletDevicesOf(ctx, out), Record: out}, nil
}

func (p *Preparer) prepare(ctx context.Context, claim *resourceapi.ResourceClaim) (_ *claimstate.Claim, finalErr error) {
	intent, err := IntentOf(claim, p.cfg.DriverName, p.cfg.NodeName)
	if err != nil {
		return nil, err
	}
	if len(intent.Devices) == 0 {
		return nil, nil
	}
	unlock, err := p.LockClaim(ctx, intent.UID)
	if err != nil {
		return nil, err
	}
	defer unlock()
	defer func() {
		if finalErr != nil {
			p.removeInterruptedSpec(ctx, intent.UID)
		}
	}()

	var action claimstate.PrepareAction
	var existing *claimstate.Claim
	err = p.view(ctx, func(s *claimstate.State) error {
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
	switch {
	case existing != nil && existing.Adopted:
		gone := p.adoptedSetupGone(ctx, existing)
		if len(gone) == 0 {
			return p.completeAdopted(ctx, claim, intent, existing)
		}
		// Prepared again from scratch: what is gone is not undone (its
		// place may be another's by now), the rest is.
		klog.FromContext(ctx).Info("A claim adopted after the checkpoint was lost holds setup that no longer exists; preparing it again", "gone", gone)
		rest := existing.Clone()
		for name := range gone {
			delete(rest.Records, name)
		}
		if err := p.RollBack(ctx, rest, true); err != nil {
			return nil, err
		}
	case action == claimstate.ActionReturnRecorded:
		if err := p.repairSpec(ctx, claim, existing); err != nil {
			return nil, err
		}
		return existing, nil
	case action == claimstate.ActionRollbackThenPrepare:
		// Before planning: a plan reads the hardware's state (what to give
		// back to whom at Undo), and a half-done preparation is not the
		// state to plan from.
		klog.FromContext(ctx).Info("Rolling back an interrupted preparation before preparing again", "startedAt", existing.StartedAt)
		if err := p.RollBack(ctx, existing, false); err != nil {
			return nil, err
		}
	}
	c, common, err := p.cfg.Node.Claim(ctx, claim, intent)
	if err != nil {
		return nil, err
	}
	records := map[string]json.RawMessage{}
	for _, conf := range p.cfg.Configurators {
		rec, err := conf.Plan(ctx, c)
		if err != nil {
			return nil, err
		}
		if rec != nil {
			records[conf.Name()] = rec
		}
	}
	return p.execute(ctx, c, common, records)
}

// removeInterruptedSpec removes, after a failed Prepare, the claim's CDI
// spec when the checkpoint has no record of the claim: the spec is then
// what an earlier attempt killed between writing it and recording the
// claim left, and a refused claim must not keep naming devices that may
// be another claim's. A spec with a record stays (a started record's is
// removed with its rollback; a completed or adopted claim's serves
// containers), and so does every spec while the checkpoint cannot be read
// (an adoption may need it). The caller holds the claim's lock.
func (p *Preparer) removeInterruptedSpec(ctx context.Context, uid string) {
	recorded := true
	if err := p.cfg.Store.View(ctx, func(s *claimstate.State) error {
		recorded = s.Claims[uid] != nil
		return nil
	}); err != nil || recorded {
		return
	}
	if err := p.cfg.CDI.Remove(uid); err != nil {
		klog.FromContext(ctx).Error(err, "Removing the CDI spec an interrupted preparation left; the sweep removes it later")
	}
}

// execute carries out a planned claim: start record, configurators, CDI
// spec, completion record. On failure it undoes what it did.
//
// A claim no configurator planned anything for gets no start record. It
// would cost a checkpoint write per claim, and nothing needs it: the
// per-claim CDI spec is named after the claim UID, so it can always be
// found again, and specs without a completed record are removed at start
// and by the sweep. It is checked as a start record would be before its
// spec is written (checkUnrecorded). Anything else is set up only after a
// start record names it, so that gpudra never holds hardware state no
// record owns.
func (p *Preparer) execute(ctx context.Context, c *Claim, common *cdispec.ContainerEdits, records map[string]json.RawMessage) (_ *claimstate.Claim, finalErr error) {
	uid := c.UID
	var startedAt time.Time
	if len(records) > 0 {
		startedAt = p.cfg.Clock()
		in := c.Intent()
		in.Records = records
		if err := p.recordStart(ctx, in, startedAt); err != nil {
			return nil, err
		}
		// done holds the records as applied; on failure every configurator
		// that got to Apply undoes its record (the one that failed too: it
		// may have done part of its work).
		var applied []Configurator
		defer func() {
			if finalErr != nil {
				finalErr = errors.Join(finalErr, p.abandon(ctx, uid, startedAt, applied, records))
			}
		}()
		// A copy of the start record in a file of its own: if
		// checkpoint.json is lost before the CDI spec is written, that file
		// is all that names what Apply sets up.
		if err := p.cfg.Store.KeepStarted(in.Claim(claimstate.PrepareStarted, startedAt)); err != nil {
			return nil, err
		}
		for _, conf := range p.cfg.Configurators {
			rec, ok := records[conf.Name()]
			if !ok {
				continue
			}
			applied = append(applied, conf)
			done, err := conf.Apply(ctx, c, rec)
			if err != nil {
				return nil, err
			}
			records[conf.Name()] = done
		}
	} else if err := p.checkUnrecorded(ctx, c.Intent()); err != nil {
		return nil, err
	}
	if err := p.fault(StepWriteCDISpec, uid); err != nil {
		return nil, err
	}
	defer func() {
		if finalErr == nil {
			return
		}
		// A failed write may have left the file behind; remove it either way.
		if err := p.cfg.CDI.Remove(uid); err != nil {
			finalErr = errors.Join(finalErr, fmt.Errorf("roll back: %w", err))
		}
	}()
	spec, err := p.spec(c, common, records)
	if err != nil {
		return nil, err
	}
	if err := p.cfg.CDI.Write(uid, spec); err != nil {
		return nil, err
	}
	if err := p.fault(StepRecordCompleted, uid); err != nil {
		return nil, err
	}
	in := c.Intent()
	if len(records) > 0 {
		in.Records = records
	}
	// The record's time is when the preparation finished, as the sweep
	// reads it.
	startedAt = p.cfg.Clock()
	if err := p.cfg.Store.Update(ctx, func(s *claimstate.State) error {
		if len(records) == 0 {
			// No start record checked the counters: a claim that started
			// since checkUnrecorded may hold them now.
			if err := checkCounters(p.cfg.Node.Model(), p.cfg.NodeName, s, unrecorded(in)); err != nil {
				return err
			}
		}
		return s.RecordCompleted(in, startedAt)
	}); err != nil {
		var refused *RefusedError
		if errors.As(err, &refused) {
			return nil, err
		}
		if isConflict(err) {
			return nil, err
		}
		return nil, fmt.Errorf("record completion in checkpoint: %w", err)
	}
	if len(records) > 0 {
		if err := p.cfg.Store.DropStarted(uid); err != nil {
			// The completed record and the CDI spec own the setup now; the
			// file is dropped at the next start.
			klog.FromContext(ctx).Error(err, "Prepared, but the start record file stays until the plugin restarts")
		}
	}
	return &claimstate.Claim{UID: in.UID, Namespace: in.Namespace, Name: in.Name, Phase: claimstate.PrepareCompleted,
		StartedAt: startedAt, Consumers: in.Consumers, Devices: in.Devices, Records: in.Records}, nil
}

// checkUnrecorded checks a claim that gets no start record (no
// configurator planned anything for it) as a start record would be
// checked, before its CDI spec is written: its devices against every
// other claim's, and the shared counters. Its completion record checks
// again, but a plugin killed between writing the spec and recording the
// completion would leave the spec of a claim whose devices another claim
// holds (a GPU held through its VFIO device after a forced deletion: chaos
// seed 67 against the real API server) until the next start or the sweep
// removes it.
func (p *Preparer) checkUnrecorded(ctx context.Context, in claimstate.Intent) error {
	return p.view(ctx, func(s *claimstate.State) error {
		if err := s.CheckConflicts(in); err != nil {
			return err
		}
		return checkCounters(p.cfg.Node.Model(), p.cfg.NodeName, s, unrecorded(in))
	})
}

// unrecorded is the claim an intent would record, for the counter check.
func unrecorded(in claimstate.Intent) *claimstate.Claim {
	return &claimstate.Claim{UID: in.UID, Namespace: in.Namespace, Name: in.Name, Consumers: in.Consumers, Devices: in.Devices}
}

// recordStart records the start of a preparation, with the guards of the
// configurators that planned something checked in the same transaction.
func (p *Preparer) recordStart(ctx context.Context, in claimstate.Intent, startedAt time.Time) error {
	err := p.update(ctx, func(s *claimstate.State) error {
		started := &claimstate.Claim{UID: in.UID, Namespace: in.Namespace, Name: in.Name, Consumers: in.Consumers, Devices: in.Devices, Records: in.Records}
		if err := p.guard(s, started); err != nil {
			return err
		}
		if err := checkCounters(p.cfg.Node.Model(), p.cfg.NodeName, s, started); err != nil {
			return err
		}
		return s.RecordStarted(in, startedAt)
	})
	if err != nil {
		var refused *RefusedError
		if isConflict(err) || errors.As(err, &refused) {
			return err
		}
		return fmt.Errorf("record start in checkpoint: %w", err)
	}
	return nil
}

// guard runs the guards ([Guard]) of the configurators whose records c,
// a claim about to be recorded as started, holds.
func (p *Preparer) guard(s *claimstate.State, c *claimstate.Claim) error {
	for _, conf := range p.cfg.Configurators {
		g, ok := conf.(Guard)
		if rec := c.Records[conf.Name()]; ok && rec != nil {
			if err := g.Guard(s, c, rec); err != nil {
				return err
			}
		}
	}
	return nil
}

// RefusedError is returned by a [Guard] that refuses a claim because of
// another claim's records; it is not a checkpoint failure, and its text
// stands for itself.
type RefusedError struct{ Err error }

func (e *RefusedError) Error() string { return e.Err.Error() }
func (e *RefusedError) Unwrap() error { return e.Err }

// rollbackTimeout bounds the rollback of a failed preparation, which runs
// on when the caller's context has ended: as long as the kubelet gives a
// call.
const rollbackTimeout = 45 * time.Second

// abandon undoes a preparation that recorded its start, in reverse order,
// then drops the start record. If an undo fails, the start record stays,
// so that the next Prepare, Unprepare or sweep tries again.
//
// It goes on when ctx has ended (the kubelet gave up on the call, or went
// away): that is when a preparation is most often abandoned, and what
// was set up would otherwise wait, held, for the retry or the sweep.
func (p *Preparer) abandon(ctx context.Context, uid string, startedAt time.Time, applied []Configurator, records map[string]json.RawMessage) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	for _, conf := range slices.Backward(applied) {
		if err := conf.Undo(ctx, uid, records[conf.Name()]); err != nil {
			return fmt.Errorf("roll back (kept the start record; retried later): %s: %w", conf.Name(), err)
		}
	}
	if err := p.cfg.Store.DropStarted(uid); err != nil {
		return fmt.Errorf("roll back (kept the start record; retried later): %w", err)
	}
	err := p.cfg.Store.Update(ctx, func(s *claimstate.State) error {
		if c := s.Claims[uid]; c != nil && c.Phase == claimstate.PrepareStarted && c.StartedAt.Equal(startedAt) {
			s.Remove(uid)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("roll back: drop the start record: %w", err)
	}
	return nil
}

// RollBack undoes what a record owns, in reverse configurator order, then
// removes the CDI spec and, when forget is set, the record. Nothing after
// a failed undo is undone, so the record keeps owning what is left and a
// retry finishes the job. The caller holds the claim's lock.
func (p *Preparer) RollBack(ctx context.Context, c *claimstate.Claim, forget bool) error {
	if err := p.undo(ctx, c); err != nil {
		return err
	}
	if err := p.cfg.CDI.Remove(c.UID); err != nil {
		return err
	}
	if !forget {
		return nil
	}
	// Before the record goes: a file that outlived its record could be
	// adopted, after a loss, as owning what may be another claim's by then.
	if err := p.cfg.Store.DropStarted(c.UID); err != nil {
		return err
	}
	return p.cfg.Store.Update(ctx, func(s *claimstate.State) error {
		s.Remove(c.UID)
		return nil
	})
}

func (p *Preparer) undo(ctx context.Context, c *claimstate.Claim) error {
	for _, name := range c.RecordNames() {
		if !slices.ContainsFunc(p.cfg.Configurators, func(conf Configurator) bool { return conf.Name() == name }) {
			return fmt.Errorf("claim %s holds a %q record, which no configurator of this plugin undoes", c.UID, name)
		}
	}
	for _, conf := range slices.Backward(p.cfg.Configurators) {
		rec, ok := c.Records[conf.Name()]
		if !ok {
			continue
		}
		if err := conf.Undo(ctx, c.UID, rec); err != nil {
			return fmt.Errorf("%s: %w", conf.Name(), err)
		}
	}
	return nil
}

// Unprepare undoes a claim and forgets it. Unpreparing a claim this node
// does not know succeeds: the call is idempotent. reported says whether
// the claim had status.devices entries that the caller should remove.
func (p *Preparer) Unprepare(ctx context.Context, claim kubeletplugin.NamespacedObject) (reported bool, _ error) {
	uid := string(claim.UID)
	logger := klog.FromContext(ctx)
	unlock, err := p.LockClaim(ctx, uid)
	if err != nil {
		return false, fmt.Errorf("unprepare claim %s: %w", claim.NamespacedName, err)
	}
	defer unlock()
	var record *claimstate.Claim
	err = p.view(ctx, func(s *claimstate.State) error {
		if c := s.Claims[uid]; c != nil {
			record = c.Clone()
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("unprepare claim %s: read checkpoint: %w", claim.NamespacedName, err)
	}
	if record == nil {
		// Unknown claim: nothing recorded, but a crash between writing the
		// spec and recording completion can leave a spec behind.
		if err := p.cfg.CDI.Remove(uid); err != nil {
			return false, fmt.Errorf("unprepare claim %s: %w", claim.NamespacedName, err)
		}
		logger.V(2).Info("Unprepare of a claim that is not prepared here; nothing to do")
		return false, nil
	}
	if err := p.RollBack(ctx, record, true); err != nil {
		return false, fmt.Errorf("unprepare claim %s: %w", claim.NamespacedName, err)
	}
	logger.V(2).Info("Unprepared", "devices", len(record.Devices))
	return p.ReportsStatus(record), nil
}

// ReportsStatus says whether a claim's devices get status.devices entries:
// some configurator gave them an identity at Prepare.
func (p *Preparer) ReportsStatus(c *claimstate.Claim) bool {
	for _, conf := range p.cfg.Configurators {
		if r, ok := conf.(StatusReporter); ok && r.ReportsDeviceStatus() && c.Records[conf.Name()] != nil {
			return true
		}
	}
	return false
}

// Restore runs the configurators' clean-ups ([Cleaner]) and then their
// restores over the completed claims at start. Failures are returned
// together; the records stay, so Prepare, Unprepare and the
// configurators' own supervision try again.
func (p *Preparer) Restore(ctx context.Context) error {
	var errs []error
	if err := p.dropStaleStarted(ctx); err != nil {
		errs = append(errs, fmt.Errorf("start record files: %w", err))
	}
	for _, conf := range p.cfg.Configurators {
		if c, ok := conf.(Cleaner); ok {
			if err := c.CleanUp(ctx); err != nil {
				errs = append(errs, fmt.Errorf("%s: clean up: %w", conf.Name(), err))
			}
		}
	}
	state, err := p.cfg.Store.Read(ctx)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, conf := range p.cfg.Configurators {
		r, ok := conf.(Restorer)
		if !ok {
			continue
		}
		var claims []*claimstate.Claim
		for _, uid := range sortedKeys(state.Claims) {
			if c := state.Claims[uid]; c.Phase == claimstate.PrepareCompleted && c.Records[conf.Name()] != nil {
				claims = append(claims, c)
			}
		}
		if len(claims) == 0 {
			continue
		}
		if err := r.Restore(ctx, claims); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", conf.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// dropStaleStarted removes the start record files ([checkpoint.StartedDirName])
// of claims the checkpoint does not record as started: their preparation
// completed or was rolled back, and the process was killed before the file
// went. Each is looked at under the claim's lock, so the file of a
// preparation another plugin instance is running (a rolling update) stays.
func (p *Preparer) dropStaleStarted(ctx context.Context) error {
	found, err := p.cfg.Store.Started()
	if err != nil {
		return err
	}
	for _, f := range found.Unreadable {
		klog.FromContext(ctx).Error(f.Err, "A start record file cannot be read: what its preparation set up, if anything, is not undone", "file", f.Path)
	}
	var errs []error
	for _, uid := range sortedKeys(found.Claims) {
		if err := p.dropIfStale(ctx, uid); err != nil {
			errs = append(errs, fmt.Errorf("claim %s: %w", uid, err))
		}
	}
	return errors.Join(errs...)
}

// dropIfStale removes the claim's start record file unless the checkpoint
// records the claim as started.
func (p *Preparer) dropIfStale(ctx context.Context, uid string) error {
	unlock, err := p.LockClaim(ctx, uid)
	if err != nil {
		return err
	}
	defer unlock()
	started := false
	if err := p.view(ctx, func(s *claimstate.State) error {
		c := s.Claims[uid]
		started = c != nil && c.Phase == claimstate.PrepareStarted
		return nil
	}); err != nil {
		return err
	}
	if started {
		return nil
	}
	return p.cfg.Store.DropStarted(uid)
}

// spec builds the claim's CDI spec, carrying its records for adoption.
func (p *Preparer) spec(c *Claim, common *cdispec.ContainerEdits, records map[string]json.RawMessage) (*cdispec.Spec, error) {
	devices := make([]cdi.SpecDevice, 0, len(c.Devices))
	seen := map[string]bool{}
	for _, d := range c.Devices {
		// One device allocated for two requests (admin access) needs one
		// CDI device; each allocation of a device with a shareID gets its
		// own.
		name := cdi.ShareName(d.Model.Name(), d.State.ShareID)
		if seen[name] {
			continue
		}
		seen[name] = true
		devices = append(devices, cdi.SpecDevice{Device: d.Model, ShareID: d.State.ShareID, Edits: d.Edits})
	}
	spec, err := cdi.BuildSpec(cdi.SpecInput{
		DriverName: p.cfg.DriverName,
		ClaimUID:   c.UID,
		Majors:     c.Inventory.Majors,
		Devices:    devices,
		Common:     common,
	})
	if err != nil {
		return nil, err
	}
	ids := make([]cdi.DeviceIdentity, 0, len(c.Devices))
	for _, d := range c.Devices {
		ids = append(ids, cdi.DeviceIdentity{Name: d.State.Name, ShareID: d.State.ShareID, UUID: d.State.UUID, ParentUUID: d.State.ParentUUID})
	}
	if err := cdi.SetClaim(spec, ids, records); err != nil {
		return nil, err
	}
	return spec, nil
}

// repairSpec writes the CDI spec of a prepared claim again if it went
// missing (someone cleaned /var/run/cdi): the kubelet asks again exactly
// when a container of the claim is about to start and needs it.
func (p *Preparer) repairSpec(ctx context.Context, claim *resourceapi.ResourceClaim, record *claimstate.Claim) error {
	if p.cfg.CDI.Exists(record.UID) {
		return nil
	}
	klog.FromContext(ctx).Info("CDI spec of a prepared claim is missing; writing it again")
	in := claimstate.Intent{UID: record.UID, Namespace: record.Namespace, Name: record.Name, Consumers: record.Consumers, Devices: record.Clone().Devices}
	c, common, err := p.cfg.Node.Claim(ctx, claim, in)
	if err != nil {
		return fmt.Errorf("write the missing CDI spec again: %w", err)
	}
	for _, conf := range p.cfg.Configurators {
		e, ok := conf.(Editor)
		if rec := record.Records[conf.Name()]; ok && rec != nil {
			if err := e.Edits(ctx, c, rec); err != nil {
				return fmt.Errorf("write the missing CDI spec again: %s: %w", conf.Name(), err)
			}
		}
	}
	spec, err := p.spec(c, common, record.Records)
	if err != nil {
		return fmt.Errorf("write the missing CDI spec again: %w", err)
	}
	return p.cfg.CDI.Write(record.UID, spec)
}

func (p *Preparer) fault(step Step, claimUID string) error {
	if p.cfg.Faults == nil {
		return nil
	}
	if err := p.cfg.Faults(step, claimUID); err != nil {
		return fmt.Errorf("injected fault at %s: %w", step, err)
	}
	return nil
}

func isConflict(err error) bool {
	var conflict *claimstate.ConflictError
	var self *claimstate.SelfConflictError
	return errors.As(err, &conflict) || errors.As(err, &self)
}

func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}
