package timeslicing

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

// IntervalField is the path of the interval in a GpuConfig; errors about
// an interval name it.
var IntervalField = field.NewPath("sharing", "timeSlicingConfig", "interval")

// Claim is a claim that holds a time-slice setting. UID alone identifies
// it; Namespace and Name only make messages readable and may be empty, as
// in a record adopted without its claim.
type Claim struct {
	UID       string
	Namespace string
	Name      string
}

// String names the claim for messages: "ns/name (uid U)", or "uid U" when
// the name is unknown.
func (c Claim) String() string {
	if c.Name == "" {
		return "uid " + c.UID
	}
	return fmt.Sprintf("%s/%s (uid %s)", c.Namespace, c.Name, c.UID)
}

// Record is one claim's hold on one GPU's time slice: what the plugin keeps
// in its checkpoint so that [Rebuild] can restore the policy.
type Record struct {
	// GPU is the GPU's UUID.
	GPU      string
	Claim    Claim
	Interval v1beta1.TimeSliceInterval
}

// Step is what the caller must do to a GPU after [Policy.Acquire] or
// [Policy.Release].
type Step struct {
	// GPU is the GPU's UUID.
	GPU string
	// Interval is the interval in force on the GPU after the call: the one
	// to set when Set is true, Default once no claim holds the GPU.
	Interval v1beta1.TimeSliceInterval
	// Set says that the GPU's time slice must be set to Interval. When it is
	// false the GPU is already as it must be.
	Set bool
}

// ConflictError refuses an interval because the GPU is already time-sliced
// with another one for a claim. It is not a fault of the claim's config
// alone: it clears once the holder is unprepared, so the kubelet's retries
// of Prepare may succeed later.
type ConflictError struct {
	// GPU is the GPU's UUID.
	GPU string
	// Claim asked for Requested.
	Claim     Claim
	Requested v1beta1.TimeSliceInterval
	// InForce is the interval Holder holds on the GPU. Holder is Claim
	// itself when one claim asks for two intervals on the same GPU.
	InForce v1beta1.TimeSliceInterval
	Holder  Claim
}

// Error implements error. It names the field, the interval asked for, the
// one in force and its holder, and the allowed values.
func (e *ConflictError) Error() string {
	var detail string
	if e.Holder.UID == e.Claim.UID {
		detail = fmt.Sprintf("another config of the same claim asks for interval %q on GPU %s; the interval applies to the whole GPU, so every config of a claim that applies to it must ask for the same one (allowed values: %s)",
			e.InForce, e.GPU, allowedIntervals())
	} else {
		detail = fmt.Sprintf("GPU %s is already time-sliced with interval %q for claim %s; the interval applies to the whole GPU, so all claims sharing it must ask for the same one (allowed values: %s): ask for %q, or wait until that claim is unprepared",
			e.GPU, e.InForce, e.Holder, allowedIntervals(), e.InForce)
	}
	return field.Invalid(IntervalField, string(e.Requested), detail).Error()
}

// Policy tracks, per GPU, which claims hold a time-slice setting and which
// interval is in force. It does no I/O: the caller applies the steps it
// returns. A Policy is not safe for concurrent use. The caller also applies
// a step before it asks about the same GPU again: a claim that joins
// without a step relies on the first holder's step having been applied, or
// rolled back with [Policy.Release] when it failed.
type Policy struct {
	gpus map[string]*gpu
}

// gpu is the time-slice state of one GPU with at least one holder.
type gpu struct {
	interval v1beta1.TimeSliceInterval
	holders  map[string]Claim
}

// New returns a Policy in which no GPU is held.
func New() *Policy {
	return &Policy{gpus: map[string]*gpu{}}
}

// Rebuild restores a Policy from the records of a checkpoint, as after a
// plugin restart. It always returns a usable Policy. Records are taken in
// the order of [Policy.Records]; one that [Policy.Acquire] would refuse (a
// second interval on a GPU, a malformed record) is left out and reported in
// the error, so that the plugin can log it and keep serving the rest.
func Rebuild(records []Record) (*Policy, error) {
	sorted := slices.Clone(records)
	slices.SortFunc(sorted, compareRecords)
	p := New()
	var errs []error
	for _, r := range sorted {
		if _, err := p.Acquire(r.GPU, r.Claim, r.Interval); err != nil {
			errs = append(errs, fmt.Errorf("record of claim %s on GPU %q left out: %w", r.Claim, r.GPU, err))
		}
	}
	return p, errors.Join(errs...)
}

// Acquire records that claim holds interval on the GPU with UUID gpuUUID.
//
// The first holder of a GPU gets a step that sets the interval, Default
// included, because nothing says what the GPU was set to before. A later
// claim with the same interval joins without a step. A claim that asks for
// another interval than the one in force gets a [*ConflictError] and the
// policy stays as it was; so does it for any other error, with the zero
// Step. Acquiring again what a claim already holds changes nothing and
// returns no step.
func (p *Policy) Acquire(gpuUUID string, claim Claim, interval v1beta1.TimeSliceInterval) (Step, error) {
	if err := validate(gpuUUID, claim.UID, interval); err != nil {
		return Step{}, err
	}
	g := p.gpus[gpuUUID]
	if g == nil {
		p.gpus[gpuUUID] = &gpu{interval: interval, holders: map[string]Claim{claim.UID: claim}}
		return Step{GPU: gpuUUID, Interval: interval, Set: true}, nil
	}
	if interval != g.interval {
		holder, ok := g.holders[claim.UID]
		if !ok {
			holder = g.holders[g.firstHolder()]
		}
		return Step{}, &ConflictError{
			GPU: gpuUUID, Claim: claim, Requested: interval, InForce: g.interval, Holder: holder,
		}
	}
	if held, ok := g.holders[claim.UID]; !ok || held.Name == "" {
		// A record adopted without its claim learns the claim's name here.
		g.holders[claim.UID] = claim
	}
	return Step{GPU: gpuUUID, Interval: g.interval}, nil
}

// Release records that claim no longer holds a time-slice setting on the
// GPU. When it was the last holder, the GPU goes back to Default, with a
// step to set it unless Default was in force already. Releasing a claim
// that holds nothing on the GPU changes nothing, so Release is idempotent
// and serves rollbacks of an Acquire whose step failed.
func (p *Policy) Release(gpuUUID, claimUID string) Step {
	g := p.gpus[gpuUUID]
	if g == nil {
		return Step{GPU: gpuUUID, Interval: v1beta1.DefaultTimeSlice}
	}
	if _, ok := g.holders[claimUID]; !ok || len(g.holders) > 1 {
		delete(g.holders, claimUID)
		return Step{GPU: gpuUUID, Interval: g.interval}
	}
	delete(p.gpus, gpuUUID)
	return Step{GPU: gpuUUID, Interval: v1beta1.DefaultTimeSlice, Set: g.interval != v1beta1.DefaultTimeSlice}
}

// InForce returns the interval held on the GPU, and false when no claim
// holds one there.
func (p *Policy) InForce(gpuUUID string) (v1beta1.TimeSliceInterval, bool) {
	if g := p.gpus[gpuUUID]; g != nil {
		return g.interval, true
	}
	return "", false
}

// Reapply returns a step that sets the interval in force on every held
// GPU, by GPU UUID. The setting does not survive a driver reload, so the
// plugin applies these once at start, after [Rebuild].
func (p *Policy) Reapply() []Step {
	steps := make([]Step, 0, len(p.gpus))
	for _, uuid := range slices.Sorted(maps.Keys(p.gpus)) {
		steps = append(steps, Step{GPU: uuid, Interval: p.gpus[uuid].interval, Set: true})
	}
	return steps
}

// Records returns every hold, sorted by GPU UUID and claim UID: the input
// [Rebuild] takes.
func (p *Policy) Records() []Record {
	var out []Record
	for uuid, g := range p.gpus {
		for _, c := range g.holders {
			out = append(out, Record{GPU: uuid, Claim: c, Interval: g.interval})
		}
	}
	slices.SortFunc(out, compareRecords)
	return out
}

// Clone returns a deep copy of p, so that a caller can try an Acquire and
// keep the result only once its step is applied.
func (p *Policy) Clone() *Policy {
	out := &Policy{gpus: make(map[string]*gpu, len(p.gpus))}
	for uuid, g := range p.gpus {
		out.gpus[uuid] = &gpu{interval: g.interval, holders: maps.Clone(g.holders)}
	}
	return out
}

// firstHolder is the smallest holder UID, so that a conflict always names
// the same holder.
func (g *gpu) firstHolder() string {
	return slices.Min(slices.Collect(maps.Keys(g.holders)))
}

func compareRecords(a, b Record) int {
	if c := strings.Compare(a.GPU, b.GPU); c != 0 {
		return c
	}
	return strings.Compare(a.Claim.UID, b.Claim.UID)
}

// validate refuses what cannot be a hold; an unknown interval is answered
// as the config validation answers it.
func validate(gpuUUID, claimUID string, interval v1beta1.TimeSliceInterval) error {
	switch {
	case gpuUUID == "":
		return errors.New("time-slice hold without a GPU UUID")
	case claimUID == "":
		return fmt.Errorf("time-slice hold on GPU %s without a claim UID", gpuUUID)
	case interval.Int() < 0:
		return field.NotSupported(IntervalField, string(interval), v1beta1.TimeSliceIntervals)
	}
	return nil
}

// allowedIntervals lists the intervals as field errors do: "Default",
// "Short", "Medium", "Long".
func allowedIntervals() string {
	quoted := make([]string, len(v1beta1.TimeSliceIntervals))
	for i, iv := range v1beta1.TimeSliceIntervals {
		quoted[i] = fmt.Sprintf("%q", iv)
	}
	return strings.Join(quoted, ", ")
}
