package preparer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// Feature is a [Configurator] written against its own record type R: the
// record it plans, applies and undoes is an R, never JSON. [Adapt] makes
// it a Configurator; the adapter decodes and encodes the records, and a
// record that does not decode is refused with a [RecordError] before the
// feature sees it. The contract of each method is the Configurator's.
//
// Plan returns nil when the claim needs nothing of the feature. Apply
// returns the record as done; nil keeps the planned record as it was.
type Feature[R any] interface {
	Name() string
	Plan(ctx context.Context, c *Claim) (*R, error)
	Apply(ctx context.Context, c *Claim, rec *R) (*R, error)
	Undo(ctx context.Context, claimUID string, rec *R) error
}

// FeatureGuard is [Guard] for a [Feature] with record R.
type FeatureGuard[R any] interface {
	Guard(s *claimstate.State, c *claimstate.Claim, rec *R) error
}

// FeatureEditor is [Editor] for a [Feature] with record R.
type FeatureEditor[R any] interface {
	Edits(ctx context.Context, c *Claim, rec *R) error
}

// FeatureChecker is [Checker] for a [Feature] with record R.
type FeatureChecker[R any] interface {
	Check(ctx context.Context, rec *R, inv *hardware.Inventory) error
}

// FeatureRestorer is [Restorer] for a [Feature] with record R: it gets
// every completed claim whose record decodes, with the record. The claims
// whose record does not decode are left out and reported by the adapter.
type FeatureRestorer[R any] interface {
	Restore(ctx context.Context, held []Held[R]) error
}

// RecordlessUndoer is implemented by features whose Undo takes down
// nothing the record names (it releases by claim UID, or there is nothing
// to undo). When such a feature's record does not decode, the adapter
// calls Undo with a nil record instead of refusing: damage in a record
// that names nothing to take down must not keep the claim from being
// unprepared.
type RecordlessUndoer interface {
	UndoesWithoutRecord()
}

// Held is a claim with its decoded record of one feature.
type Held[R any] struct {
	Claim  *claimstate.Claim
	Record *R
}

// Codec reads and writes the records of the feature called Name, for the
// places a feature looks at records other than the one it is handed (the
// other claims of a [claimstate.State], an [Adoption]).
type Codec[R any] struct {
	Name string
}

// Decode decodes a record strictly: a record of this plugin's own making
// that does not decode is damage, reported as a [RecordError].
func (k Codec[R]) Decode(raw json.RawMessage) (*R, error) {
	var out R
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, &RecordError{Name: k.Name, Err: err}
	}
	return &out, nil
}

// Encode encodes a record.
func (k Codec[R]) Encode(rec *R) (json.RawMessage, error) {
	raw, err := json.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint record %s: %w", k.Name, err)
	}
	return raw, nil
}

// Of returns the claim's record, or nil when it holds none.
func (k Codec[R]) Of(c *claimstate.Claim) (*R, error) {
	raw := c.Records[k.Name]
	if raw == nil {
		return nil, nil
	}
	return k.Decode(raw)
}

// Set gives the claim the record.
func (k Codec[R]) Set(c *claimstate.Claim, rec *R) error {
	raw, err := k.Encode(rec)
	if err != nil {
		return err
	}
	if c.Records == nil {
		c.Records = map[string]json.RawMessage{}
	}
	c.Records[k.Name] = raw
	return nil
}

// Adapter is a [Feature] as a [Configurator]. It implements every optional
// configurator interface, delegating to the feature where the feature
// implements the typed one and doing what the preparer does without it
// otherwise (nothing), so the preparer needs no knowledge of record types.
type Adapter[R any] struct {
	feature Feature[R]
	codec   Codec[R]
}

// Adapt makes the feature a [Configurator].
func Adapt[R any](f Feature[R]) *Adapter[R] {
	return &Adapter[R]{feature: f, codec: Codec[R]{Name: f.Name()}}
}

// Feature returns the adapted feature.
func (a *Adapter[R]) Feature() Feature[R] { return a.feature }

// Name implements [Configurator].
func (a *Adapter[R]) Name() string { return a.codec.Name }

// Plan implements [Configurator].
func (a *Adapter[R]) Plan(ctx context.Context, c *Claim) (json.RawMessage, error) {
	rec, err := a.feature.Plan(ctx, c)
	if err != nil || rec == nil {
		return nil, err
	}
	return a.codec.Encode(rec)
}

// Apply implements [Configurator].
func (a *Adapter[R]) Apply(ctx context.Context, c *Claim, raw json.RawMessage) (json.RawMessage, error) {
	rec, err := a.codec.Decode(raw)
	if err != nil {
		return nil, err
	}
	done, err := a.feature.Apply(ctx, c, rec)
	if err != nil {
		return nil, err
	}
	if done == nil {
		return raw, nil
	}
	return a.codec.Encode(done)
}

// Undo implements [Configurator].
func (a *Adapter[R]) Undo(ctx context.Context, claimUID string, raw json.RawMessage) error {
	rec, err := a.codec.Decode(raw)
	if _, recordless := a.feature.(RecordlessUndoer); err != nil && !recordless {
		return err
	}
	return a.feature.Undo(ctx, claimUID, rec)
}

// Guard implements [Guard].
func (a *Adapter[R]) Guard(s *claimstate.State, c *claimstate.Claim, raw json.RawMessage) error {
	g, ok := a.feature.(FeatureGuard[R])
	if !ok {
		return nil
	}
	rec, err := a.codec.Decode(raw)
	if err != nil {
		return err
	}
	return g.Guard(s, c, rec)
}

// Edits implements [Editor].
func (a *Adapter[R]) Edits(ctx context.Context, c *Claim, raw json.RawMessage) error {
	e, ok := a.feature.(FeatureEditor[R])
	if !ok {
		return nil
	}
	rec, err := a.codec.Decode(raw)
	if err != nil {
		return err
	}
	return e.Edits(ctx, c, rec)
}

// Check implements [Checker].
func (a *Adapter[R]) Check(ctx context.Context, raw json.RawMessage, inv *hardware.Inventory) error {
	ch, ok := a.feature.(FeatureChecker[R])
	if !ok {
		return nil
	}
	rec, err := a.codec.Decode(raw)
	if err != nil {
		return err
	}
	return ch.Check(ctx, rec, inv)
}

// Restore implements [Restorer]: the feature restores the claims whose
// record decodes, and each claim whose record does not is an error of its
// own, so that one damaged record does not keep the others unrestored.
func (a *Adapter[R]) Restore(ctx context.Context, claims []*claimstate.Claim) error {
	r, ok := a.feature.(FeatureRestorer[R])
	if !ok {
		return nil
	}
	var errs []error
	held := make([]Held[R], 0, len(claims))
	for _, c := range claims {
		rec, err := a.codec.Of(c)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("claim %s: %w", c.UID, err))
		case rec != nil:
			held = append(held, Held[R]{Claim: c, Record: rec})
		}
	}
	if len(held) > 0 {
		if err := r.Restore(ctx, held); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// CleanUp implements [Cleaner].
func (a *Adapter[R]) CleanUp(ctx context.Context) error {
	if c, ok := a.feature.(Cleaner); ok {
		return c.CleanUp(ctx)
	}
	return nil
}

// Adopt implements [Adopter].
func (a *Adapter[R]) Adopt(ctx context.Context, in *Adoption) error {
	if ad, ok := a.feature.(Adopter); ok {
		return ad.Adopt(ctx, in)
	}
	return nil
}

// ReportsDeviceStatus implements [StatusReporter].
func (a *Adapter[R]) ReportsDeviceStatus() bool {
	r, ok := a.feature.(StatusReporter)
	return ok && r.ReportsDeviceStatus()
}
