package timeslicing_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/internal/featuretest"
	"github.com/gpudra/gpudra/pkg/claimstate"
	timeslicingfeature "github.com/gpudra/gpudra/pkg/features/timeslicing"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
	"github.com/gpudra/gpudra/pkg/timeslicing"
)

// FuzzRecord feeds arbitrary bytes to the time-slicing configurator as a
// record: another claim's in Guard and Restore, the claim's own in Apply
// and Undo, with the checkpoint holding it. None panics, and a record that
// does not decode is refused as damage, naming the record: a hold that
// cannot be read may be the one that keeps a GPU's interval.
func FuzzRecord(f *testing.F) {
	for _, seed := range featuretest.Seeds(f, timeslicingfeature.Name,
		`{"gpus":[{"device":"gpu-0","gpu":"`+gpu+`","interval":"Medium"},{"device":"gpu-0","gpu":"`+gpu+`","interval":"Long"}]}`,
		`{"gpus":[{"device":"gpu-0","gpu":"","interval":"Forever"}]}`,
		`{"gpus":[{"device":"gpu-0","gpu":"`+gpu+`","interval":""}]}`,
		`{"gpus":null}`, `{"gpus":[null]}`) {
		f.Add(seed)
	}
	dir := f.TempDir()
	own := featuretest.Marshal(f, timeslicingfeature.Record{GPUs: []timeslicingfeature.Hold{{Device: "gpu-0", GPU: gpu, Interval: v1beta1.LongTimeSlice}}})
	f.Fuzz(func(t *testing.T, rec []byte) {
		ctx := context.Background()
		state := claimstate.New()
		state.Claims["other"] = &claimstate.Claim{UID: "other", Namespace: "ns", Name: "other", Phase: claimstate.PrepareCompleted,
			Records: map[string]json.RawMessage{timeslicingfeature.Name: rec}}
		read := func(context.Context) (*claimstate.State, error) { return state.Clone(), nil }
		setter := &timeslicing.Memory{}
		c := preparer.Adapt[timeslicingfeature.Record](timeslicingfeature.New(setter, dir, read, true))
		mine := &claimstate.Claim{UID: "mine", Namespace: "ns", Name: "mine"}

		// Another claim's record, read from the checkpoint.
		err := c.Guard(state, mine, own)
		featuretest.CheckRefusal[timeslicingfeature.Record](t, timeslicingfeature.Name, "Guard", rec, err)
		err = c.Restore(ctx, []*claimstate.Claim{state.Claims["other"]})
		featuretest.CheckRefusal[timeslicingfeature.Record](t, timeslicingfeature.Name, "Restore", rec, err)

		// The claim's own record, read from the checkpoint.
		delete(state.Claims, "other")
		state.Claims["mine"] = &claimstate.Claim{UID: "mine", Phase: claimstate.PrepareStarted,
			Records: map[string]json.RawMessage{timeslicingfeature.Name: rec}}
		_, err = c.Apply(ctx, &preparer.Claim{UID: "mine", Namespace: "ns", Name: "mine", Inventory: &hardware.Inventory{}}, rec)
		featuretest.CheckRefusal[timeslicingfeature.Record](t, timeslicingfeature.Name, "Apply", rec, err)
		err = c.Undo(ctx, "mine", rec)
		featuretest.CheckRefusal[timeslicingfeature.Record](t, timeslicingfeature.Name, "Undo", rec, err)
		if err == nil {
			// The last holder gone, every GPU it held is back at Default.
			r, _ := (preparer.Codec[timeslicingfeature.Record]{Name: timeslicingfeature.Name}).Decode(rec)
			for _, h := range r.GPUs {
				if got, _ := setter.Interval(h.GPU); got != "" && got != v1beta1.DefaultTimeSlice {
					t.Fatalf("GPU %q left at %q after the only holder's Undo of %q", h.GPU, got, rec)
				}
			}
		}
	})
}
