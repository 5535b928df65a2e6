package preparer_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// widgetRecord is the record of a test feature.
type widgetRecord struct {
	Widgets []string `json:"widgets"`
}

// widgets is a feature that records what it was handed, so that the test
// can tell what the adapter decoded and passed on.
type widgets struct {
	plan     *widgetRecord
	undone   []*widgetRecord
	guarded  []*widgetRecord
	restored []preparer.Held[widgetRecord]
}

func (w *widgets) Name() string { return "widgets" }

func (w *widgets) Plan(context.Context, *preparer.Claim) (*widgetRecord, error) {
	return w.plan, nil
}

func (w *widgets) Apply(_ context.Context, _ *preparer.Claim, rec *widgetRecord) (*widgetRecord, error) {
	rec.Widgets = append(rec.Widgets, "made")
	return rec, nil
}

func (w *widgets) Undo(_ context.Context, _ string, rec *widgetRecord) error {
	w.undone = append(w.undone, rec)
	return nil
}

func (w *widgets) Guard(_ *claimstate.State, _ *claimstate.Claim, rec *widgetRecord) error {
	w.guarded = append(w.guarded, rec)
	return nil
}

func (w *widgets) Restore(_ context.Context, held []preparer.Held[widgetRecord]) error {
	w.restored = append(w.restored, held...)
	return nil
}

// recordless is widgets whose Undo needs nothing of the record.
type recordless struct{ widgets }

func (*recordless) UndoesWithoutRecord() {}

func TestAdapterDecodesAndEncodes(t *testing.T) {
	ctx := context.Background()
	w := &widgets{}
	a := preparer.Adapt[widgetRecord](w)
	if a.Name() != "widgets" {
		t.Fatalf("Name = %q", a.Name())
	}

	raw, err := a.Plan(ctx, &preparer.Claim{})
	if err != nil || raw != nil {
		t.Fatalf("Plan with nothing to do = %q, %v; want nil, nil", raw, err)
	}
	w.plan = &widgetRecord{Widgets: []string{"a"}}
	raw, err = a.Plan(ctx, &preparer.Claim{})
	if err != nil || string(raw) != `{"widgets":["a"]}` {
		t.Fatalf("Plan = %s, %v", raw, err)
	}
	done, err := a.Apply(ctx, &preparer.Claim{}, raw)
	if err != nil || string(done) != `{"widgets":["a","made"]}` {
		t.Fatalf("Apply = %s, %v; want the record as the feature returned it", done, err)
	}
	if err := a.Guard(claimstate.New(), &claimstate.Claim{}, done); err != nil || len(w.guarded) != 1 || len(w.guarded[0].Widgets) != 2 {
		t.Fatalf("Guard = %v, the feature got %+v", err, w.guarded)
	}

	// The optional interfaces the feature lacks do nothing.
	if err := a.Edits(ctx, &preparer.Claim{}, json.RawMessage(`not json`)); err != nil {
		t.Fatalf("Edits of a feature without edits = %v", err)
	}
	if err := a.Check(ctx, json.RawMessage(`not json`), &hardware.Inventory{}); err != nil {
		t.Fatalf("Check of a feature without a check = %v", err)
	}
	if a.ReportsDeviceStatus() {
		t.Fatal("ReportsDeviceStatus of a feature that is no StatusReporter")
	}
}

func TestAdapterRefusesDamagedRecords(t *testing.T) {
	ctx := context.Background()
	damaged := json.RawMessage(`{"widgets":"not a list"}`)
	w := &widgets{}
	a := preparer.Adapt[widgetRecord](w)
	for name, err := range map[string]error{
		"Apply": func() error { _, err := a.Apply(ctx, &preparer.Claim{}, damaged); return err }(),
		"Undo":  a.Undo(ctx, "uid", damaged),
		"Guard": a.Guard(claimstate.New(), &claimstate.Claim{}, damaged),
	} {
		var recErr *preparer.RecordError
		if !errors.As(err, &recErr) || recErr.Name != "widgets" {
			t.Errorf("%s of a damaged record = %v, want a RecordError naming widgets", name, err)
		}
	}
	if len(w.undone) != 0 || len(w.guarded) != 0 {
		t.Fatalf("the feature saw a damaged record: undone %v, guarded %v", w.undone, w.guarded)
	}

	// A feature whose Undo needs no record is undone all the same.
	r := &recordless{}
	if err := preparer.Adapt[widgetRecord](r).Undo(ctx, "uid", damaged); err != nil {
		t.Fatalf("Undo of a recordless feature's damaged record = %v", err)
	}
	if len(r.undone) != 1 || r.undone[0] != nil {
		t.Fatalf("the recordless feature's Undo got %v, want one call with a nil record", r.undone)
	}
}

func TestAdapterRestoresWhatDecodes(t *testing.T) {
	w := &widgets{}
	claims := []*claimstate.Claim{
		{UID: "good", Records: map[string]json.RawMessage{"widgets": json.RawMessage(`{"widgets":["x"]}`)}},
		{UID: "damaged", Records: map[string]json.RawMessage{"widgets": json.RawMessage(`[`)}},
	}
	err := preparer.Adapt[widgetRecord](w).Restore(context.Background(), claims)
	var recErr *preparer.RecordError
	if !errors.As(err, &recErr) {
		t.Fatalf("Restore with a damaged record = %v, want a RecordError", err)
	}
	if len(w.restored) != 1 || w.restored[0].Claim.UID != "good" || w.restored[0].Record.Widgets[0] != "x" {
		t.Fatalf("restored %+v, want the good claim with its record", w.restored)
	}
}

func TestCodec(t *testing.T) {
	codec := preparer.Codec[widgetRecord]{Name: "widgets"}
	c := &claimstate.Claim{UID: "c"}
	if rec, err := codec.Of(c); rec != nil || err != nil {
		t.Fatalf("Of a claim without the record = %v, %v", rec, err)
	}
	if err := codec.Set(c, &widgetRecord{Widgets: []string{"y"}}); err != nil {
		t.Fatal(err)
	}
	rec, err := codec.Of(c)
	if err != nil || len(rec.Widgets) != 1 || rec.Widgets[0] != "y" {
		t.Fatalf("Of after Set = %+v, %v", rec, err)
	}
}
