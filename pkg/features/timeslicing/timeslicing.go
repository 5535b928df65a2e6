// Package timeslicing is the configurator of GpuConfig sharing strategy
// TimeSlicing: one time-slice interval per GPU, held by every claim that
// asked for it, set by the first holder and reset to Default by the last.
// The holds live in the claims' records; timeslicing.Policy decides from
// them what to set.
package timeslicing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"

	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/internal/lockedfile"
	"github.com/gpudra/gpudra/pkg/claimconfig"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/features/sharing"
	"github.com/gpudra/gpudra/pkg/preparer"
	"github.com/gpudra/gpudra/pkg/timeslicing"
)

// Name is the configurator's record name in the checkpoint.
const Name = "timeSlicing"

// LockFileName is the lock file, in the plugin's data directory, that
// every change of a GPU's time slice is made under, by every plugin
// instance on the node.
const LockFileName = "timeslice.lock"

// ReleasedFileName is the file, in the plugin's data directory and
// written under the lock, that lists the claims whose holds Undo released
// while their records may still be in the checkpoint (a claim's record
// goes only once all its undos succeeded). A later Undo does not count
// them as holders: two last holders unprepared at once, in one instance
// or two, would otherwise each leave the reset to the other, and the GPU
// would keep an interval no claim holds.
const ReleasedFileName = "timeslice-released.json"

// Record lists a claim's holds.
type Record struct {
	GPUs []Hold `json:"gpus"`
}

// Hold is a claim's time slice on one GPU.
type Hold struct {
	// Device is the published device name.
	Device string `json:"device"`
	// GPU is the GPU's UUID.
	GPU      string                    `json:"gpu"`
	Interval v1beta1.TimeSliceInterval `json:"interval"`
}

// State reads the node's prepared-claim state (the checkpoint).
type State func(ctx context.Context) (*claimstate.State, error)

// Configurator sets time slices.
type Configurator struct {
	setter timeslicing.Setter
	state  State
	// lock serializes every change of a GPU's time slice, in this
	// process and across plugin instances (a rolling update), so that a
	// reset by the last holder never lands after a new holder's setting.
	lock *lockedfile.Mutex
	// released is the ReleasedFileName file.
	released string
	// mpsAvailable adds MPS to the strategies an error offers.
	mpsAvailable bool
}

var (
	_ preparer.Cleaner                 = &Configurator{}
	_ preparer.Feature[Record]         = &Configurator{}
	_ preparer.FeatureGuard[Record]    = &Configurator{}
	_ preparer.FeatureRestorer[Record] = &Configurator{}
	_ preparer.FeatureMetadata[Record] = &Configurator{}
)

// records reads the other claims' records.
var codec = preparer.Codec[Record]{Name: Name}

// New returns the configurator. setter nil refuses the strategy; dataDir
// holds the lock file; state reads the checkpoint; mpsAvailable says
// whether the node offers MPS instead.
func New(setter timeslicing.Setter, dataDir string, state State, mpsAvailable bool) *Configurator {
	return &Configurator{setter: setter, state: state, lock: lockedfile.NewMutex(filepath.Join(dataDir, LockFileName)),
		released: filepath.Join(dataDir, ReleasedFileName), mpsAvailable: mpsAvailable}
}

// Name implements [preparer.Feature].
func (c *Configurator) Name() string { return Name }

// Unavailable says why the node cannot set time slices.
const Unavailable = "no nvidia-smi: see --nvidia-smi-path"

// Plan implements [preparer.Feature]: the holds of the claim's full
// GPUs whose config asks for TimeSlicing. A MIG device's time slice cannot
// be tuned: its containers share it with the driver's scheduling. A share
// whose caps MPS enforces cannot be time-sliced instead.
func (c *Configurator) Plan(_ context.Context, cl *preparer.Claim) (*Record, error) {
	var rec Record
	intervals := timeslicing.New()
	claim := timeslicing.Claim{UID: cl.UID, Namespace: cl.Namespace, Name: cl.Name}
	for _, d := range cl.Devices {
		if d.State.AdminAccess {
			// Admin access (monitoring) must not change how the device is
			// shared with the claims that use it.
			continue
		}
		strategy, ts, _ := sharing.Settings(d.Config.Config)
		if strategy != v1beta1.TimeSlicingStrategy {
			continue
		}
		capped, _, err := sharing.ShareLimits(d)
		if err != nil {
			return nil, err
		}
		if capped {
			return nil, fmt.Errorf("device %s: %s: sharing.strategy TimeSlicing: the device is a share of a GPU shared by %s, whose caps only MPS enforces; allowed here: sharing.strategy MPS, or no sharing setting",
				d.Model.Name(), d.Config.Origin, d.Model.Sharing)
		}
		if d.Config.Kind == claimconfig.MIG {
			continue
		}
		if c.setter == nil {
			hint := ""
			if c.mpsAvailable {
				hint = ", sharing.strategy MPS"
			}
			return nil, fmt.Errorf("device %s: %s: sharing.strategy %s: this node cannot set time slices (%s); allowed here: no sharing setting%s",
				d.Model.Name(), d.Config.Origin, strategy, Unavailable, hint)
		}
		interval := v1beta1.DefaultTimeSlice
		if ts != nil && ts.Interval != nil {
			interval = *ts.Interval
		}
		// One claim must not ask for two intervals on one GPU.
		if _, err := intervals.Acquire(d.State.UUID, claim, interval); err != nil {
			return nil, fmt.Errorf("device %s: %s: %w", d.Model.Name(), d.Config.Origin, err)
		}
		rec.GPUs = append(rec.GPUs, Hold{Device: d.Model.Name(), GPU: d.State.UUID, Interval: interval})
	}
	if len(rec.GPUs) == 0 {
		return nil, nil
	}
	return &rec, nil
}

// Guard implements [preparer.FeatureGuard]: another claim must not hold one of
// the claim's GPUs with another interval. It runs inside the checkpoint
// update that records the start, so two claims cannot both pass with
// different intervals.
func (c *Configurator) Guard(s *claimstate.State, cl *claimstate.Claim, rec *Record) error {
	policy, err := policyOf(s, cl.UID, nil)
	if err != nil {
		return err
	}
	claim := timeslicing.Claim{UID: cl.UID, Namespace: cl.Namespace, Name: cl.Name}
	for _, h := range rec.GPUs {
		if _, err := policy.Acquire(h.GPU, claim, h.Interval); err != nil {
			return &preparer.RefusedError{Err: err}
		}
	}
	return nil
}

// Apply implements [preparer.Feature]: the policy, rebuilt from the
// other claims' records, gives the interval in force on each GPU, and it
// is set, also when the claim joins holders of the same interval. A
// joiner cannot tell whether the holder it joins is being unprepared right
// now (its record goes only after its reset): under the lock, a reset that
// got there first is set right again by the joiner, and a reset that comes
// later sees the joiner's start record and leaves the GPU alone. Setting
// the interval in force again is harmless, and heals a GPU whose setting
// was lost (a driver reload).
func (c *Configurator) Apply(ctx context.Context, cl *preparer.Claim, rec *Record) (*Record, error) {
	if c.setter == nil {
		return nil, fmt.Errorf("this node cannot set time slices (%s)", Unavailable)
	}
	unlock, err := c.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	s, err := c.state(ctx)
	if err != nil {
		return nil, err
	}
	policy, err := policyOf(s, cl.UID, nil)
	if err != nil {
		return nil, err
	}
	// A claim prepared again after a rollback holds again.
	if err := c.updateReleased(s, cl.UID, false); err != nil {
		return nil, err
	}
	claim := timeslicing.Claim{UID: cl.UID, Namespace: cl.Namespace, Name: cl.Name}
	for _, h := range sortedHolds(rec) {
		step, err := policy.Acquire(h.GPU, claim, h.Interval)
		if err != nil {
			return nil, err
		}
		if err := c.setter.Set(ctx, step.GPU, step.Interval); err != nil {
			return nil, fmt.Errorf("set time slice %s on GPU %s: %w", step.Interval, step.GPU, err)
		}
	}
	return rec, nil
}

// Undo implements [preparer.Feature]: the GPUs of which the claim is
// the last holder go back to Default. The claim's record is still in the
// checkpoint; the caller forgets it only once this succeeded, so a failed
// reset is tried again.
func (c *Configurator) Undo(ctx context.Context, claimUID string, rec *Record) error {
	if len(rec.GPUs) == 0 {
		return nil
	}
	if c.setter == nil {
		return fmt.Errorf("claim %s holds time slices on GPUs %v, but this node cannot set time slices now (%s)", claimUID, gpus(rec), Unavailable)
	}
	unlock, err := c.acquire(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	s, err := c.state(ctx)
	if err != nil {
		return err
	}
	released, err := c.readReleased()
	if err != nil {
		return err
	}
	policy, err := policyOf(s, claimUID, released)
	if err != nil {
		return err
	}
	claim := timeslicing.Claim{UID: claimUID}
	for _, h := range sortedHolds(rec) {
		// Hold it in the policy, then release it: the step says whether
		// this claim was the last holder. A hold the others contradict
		// (never set) releases nothing.
		if _, err := policy.Acquire(h.GPU, claim, h.Interval); err != nil {
			continue
		}
		step := policy.Release(h.GPU, claimUID)
		if !step.Set {
			continue
		}
		if err := c.setter.Set(ctx, step.GPU, step.Interval); err != nil {
			return fmt.Errorf("reset time slice of GPU %s to %s: %w", step.GPU, step.Interval, err)
		}
	}
	return c.updateReleased(s, claimUID, true)
}

// Restore implements [preparer.FeatureRestorer]: the intervals held are applied
// again, since the setting is lost when the driver reloads.
func (c *Configurator) Restore(ctx context.Context, held []preparer.Held[Record]) error {
	if c.setter == nil {
		return fmt.Errorf("%d prepared claim(s) hold time slices, but this node cannot set time slices now (%s)", len(held), Unavailable)
	}
	unlock, err := c.acquire(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	s := claimstate.New()
	for _, h := range held {
		s.Claims[h.Claim.UID] = h.Claim
	}
	released, err := c.readReleased()
	if err != nil {
		return err
	}
	policy, rebuildErr := policyOf(s, "", released)
	var errs []error
	if rebuildErr != nil {
		errs = append(errs, rebuildErr)
	}
	for _, step := range policy.Reapply() {
		if err := c.setter.Set(ctx, step.GPU, step.Interval); err != nil {
			errs = append(errs, fmt.Errorf("set time slice %s on GPU %s: %w", step.Interval, step.GPU, err))
		}
	}
	return errors.Join(errs...)
}

// CleanUp implements [preparer.Cleaner]: the temp files of the released
// claims' file that a killed plugin left.
func (c *Configurator) CleanUp(ctx context.Context) error {
	release, err := c.acquire(ctx)
	if err != nil {
		return err
	}
	defer release()
	removed, err := lockedfile.RemoveStaleTemps(c.released)
	if len(removed) > 0 {
		klog.FromContext(ctx).Info("Removed temp files a killed plugin left", "files", removed)
	}
	return err
}

// acquire takes the time-slice lock, in process and across processes.
func (c *Configurator) acquire(ctx context.Context) (func(), error) {
	unlock, err := c.lock.Lock(ctx)
	if err != nil {
		return nil, fmt.Errorf("take the time-slice lock %s: %w", c.lock.Path(), err)
	}
	return unlock, nil
}

// policyOf rebuilds the node's time-slice holds from every record but the
// claim with UID except and the released claims. Unreadable records are an
// error: a hold that cannot be read may be the one that keeps a GPU's
// interval.
func policyOf(s *claimstate.State, except string, released map[string]bool) (*timeslicing.Policy, error) {
	var records []timeslicing.Record
	for uid, cl := range s.Claims {
		if uid == except || released[uid] {
			continue
		}
		rec, err := codec.Of(cl)
		if err != nil {
			return timeslicing.New(), fmt.Errorf("claim %s: %w", uid, err)
		}
		if rec == nil {
			continue
		}
		for _, h := range rec.GPUs {
			records = append(records, timeslicing.Record{GPU: h.GPU, Claim: timeslicing.Claim{UID: uid, Namespace: cl.Namespace, Name: cl.Name}, Interval: h.Interval})
		}
	}
	return timeslicing.Rebuild(records)
}

// readReleased reads the released claims; the caller holds the lock.
func (c *Configurator) readReleased() (map[string]bool, error) {
	released := map[string]bool{}
	data, err := os.ReadFile(c.released)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return released, nil
	case err != nil:
		return nil, fmt.Errorf("read released time-slice holds: %w", err)
	}
	var uids []string
	if err := json.Unmarshal(data, &uids); err != nil {
		return nil, fmt.Errorf("read released time-slice holds %s: %w", c.released, err)
	}
	for _, uid := range uids {
		released[uid] = true
	}
	return released, nil
}

// updateReleased adds the claim to the released claims (or takes it out),
// and forgets those whose records are gone from s. The caller holds the
// lock.
func (c *Configurator) updateReleased(s *claimstate.State, uid string, release bool) error {
	released, err := c.readReleased()
	if err != nil {
		return err
	}
	if !release && !released[uid] {
		return nil
	}
	for other := range released {
		if s.Claims[other] == nil {
			delete(released, other)
		}
	}
	if release {
		released[uid] = true
	} else {
		delete(released, uid)
	}
	data, err := json.Marshal(slices.Sorted(maps.Keys(released)))
	if err != nil {
		return err
	}
	if err := lockedfile.Write(c.released, data); err != nil {
		return fmt.Errorf("record released time-slice holds: %w", err)
	}
	return nil
}

func sortedHolds(rec *Record) []Hold {
	byGPU := map[string]Hold{}
	for _, h := range rec.GPUs {
		byGPU[h.GPU] = h
	}
	out := make([]Hold, 0, len(byGPU))
	for _, gpu := range slices.Sorted(maps.Keys(byGPU)) {
		out = append(out, byGPU[gpu])
	}
	return out
}

func gpus(rec *Record) []string {
	out := make([]string, 0, len(rec.GPUs))
	for _, h := range sortedHolds(rec) {
		out = append(out, h.GPU)
	}
	return out
}
