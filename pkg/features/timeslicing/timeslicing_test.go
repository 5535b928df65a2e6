package timeslicing_test

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/claimstate"
	timeslicingfeature "github.com/gpudra/gpudra/pkg/features/timeslicing"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
	"github.com/gpudra/gpudra/pkg/timeslicing"
)

const gpu = "GPU-0b5c1a52-7c1e-4a47-9b0e-3b8e0f1d2c3a"

// sharedState is the checkpoint both plugin instances of a rolling update
// read.
type sharedState struct {
	mu sync.Mutex
	s  *claimstate.State
}

func (st *sharedState) read(context.Context) (*claimstate.State, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.s.Clone(), nil
}

func (st *sharedState) set(uid string, rec json.RawMessage) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if rec == nil {
		delete(st.s.Claims, uid)
		return
	}
	st.s.Claims[uid] = &claimstate.Claim{UID: uid, Phase: claimstate.PrepareStarted, Records: map[string]json.RawMessage{timeslicingfeature.Name: rec}}
}

// gatedSetter blocks every reset to Default until released.
type gatedSetter struct {
	timeslicing.Memory
	entered chan struct{}
	release chan struct{}
}

func (g *gatedSetter) Set(ctx context.Context, gpuUUID string, interval v1beta1.TimeSliceInterval) error {
	if interval == v1beta1.DefaultTimeSlice {
		g.entered <- struct{}{}
		<-g.release
	}
	return g.Memory.Set(ctx, gpuUUID, interval)
}

func record(t *testing.T, interval v1beta1.TimeSliceInterval) json.RawMessage {
	t.Helper()
	rec, err := json.Marshal(timeslicingfeature.Record{GPUs: []timeslicingfeature.Hold{{Device: "gpu-0", GPU: gpu, Interval: interval}}})
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestRollingUpdateResetAndJoin: the old plugin instance resets the GPU
// as its last holder leaves while the new instance prepares a claim that
// joins with the same interval. Whatever the timing, the GPU ends with the
// joiner's interval: the reset and the join are serialized across
// instances, and the join sets the interval again.
func TestRollingUpdateResetAndJoin(t *testing.T) {
	dir := t.TempDir()
	state := &sharedState{s: claimstate.New()}
	setter := &gatedSetter{entered: make(chan struct{}), release: make(chan struct{})}
	if err := setter.Memory.Set(context.Background(), gpu, v1beta1.LongTimeSlice); err != nil {
		t.Fatal(err)
	}
	oldInstance := preparer.Adapt[timeslicingfeature.Record](timeslicingfeature.New(setter, dir, state.read, false))
	newInstance := preparer.Adapt[timeslicingfeature.Record](timeslicingfeature.New(setter, dir, state.read, false))
	long := record(t, v1beta1.LongTimeSlice)
	state.set("leaving", long)

	undone := make(chan error, 1)
	go func() { undone <- oldInstance.Undo(context.Background(), "leaving", long) }()
	<-setter.entered // the old instance decided to reset and is resetting

	state.set("joining", long) // the new instance's start record
	joiner := &preparer.Claim{UID: "joining", Inventory: &hardware.Inventory{}}
	applied := make(chan error, 1)
	go func() {
		_, err := newInstance.Apply(context.Background(), joiner, long)
		applied <- err
	}()
	select {
	case err := <-applied:
		t.Fatalf("the join ran while the other instance was resetting the GPU (err %v)", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(setter.release)
	if err := <-undone; err != nil {
		t.Fatal(err)
	}
	state.set("leaving", nil)
	if err := <-applied; err != nil {
		t.Fatal(err)
	}
	if got, _ := setter.Interval(gpu); got != v1beta1.LongTimeSlice {
		t.Errorf("GPU interval after the reset and the join = %q, want Long", got)
	}
}

// TestLastTwoHoldersUnpreparedAtOnce: the last two holders of a GPU are
// unprepared at the same time, in one plugin instance or in two. Each
// Undo runs while the other claim's record is still in the checkpoint
// (records go only after all their undos), so each used to find the other
// still holding, and the GPU kept an interval no claim held (the chaos run,
// internal/chaos, seed 1140). The one that undoes last resets it.
func TestLastTwoHoldersUnpreparedAtOnce(t *testing.T) {
	for name, instances := range map[string]int{"one instance": 1, "two instances": 2} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			state := &sharedState{s: claimstate.New()}
			setter := &timeslicing.Memory{}
			first := preparer.Adapt[timeslicingfeature.Record](timeslicingfeature.New(setter, dir, state.read, false))
			second := first
			if instances == 2 {
				second = preparer.Adapt[timeslicingfeature.Record](timeslicingfeature.New(setter, dir, state.read, false))
			}
			medium := record(t, v1beta1.MediumTimeSlice)
			for _, uid := range []string{"a", "b"} {
				state.set(uid, medium)
				if _, err := first.Apply(ctx, &preparer.Claim{UID: uid, Inventory: &hardware.Inventory{}}, medium); err != nil {
					t.Fatal(err)
				}
			}
			// Both undo before either record goes.
			if err := first.Undo(ctx, "a", medium); err != nil {
				t.Fatal(err)
			}
			if got, _ := setter.Interval(gpu); got != v1beta1.MediumTimeSlice {
				t.Fatalf("after the first of two holders: %q, want Medium", got)
			}
			if err := second.Undo(ctx, "b", medium); err != nil {
				t.Fatal(err)
			}
			state.set("a", nil)
			state.set("b", nil)
			if got, _ := setter.Interval(gpu); got != v1beta1.DefaultTimeSlice {
				t.Errorf("after both holders: %q, want Default", got)
			}
			// A claim prepared again after its rollback holds again.
			state.set("c", medium)
			if _, err := first.Apply(ctx, &preparer.Claim{UID: "c", Inventory: &hardware.Inventory{}}, medium); err != nil {
				t.Fatal(err)
			}
			if err := first.Undo(ctx, "c", medium); err != nil {
				t.Fatal(err)
			}
			if _, err := first.Apply(ctx, &preparer.Claim{UID: "c", Inventory: &hardware.Inventory{}}, medium); err != nil {
				t.Fatal(err)
			}
			state.set("d", medium)
			if err := second.Undo(ctx, "d", medium); err != nil {
				t.Fatal(err)
			}
			if got, _ := setter.Interval(gpu); got != v1beta1.MediumTimeSlice {
				t.Errorf("a holder prepared again after its rollback was counted as released: GPU at %q, want Medium", got)
			}
		})
	}
}

// Crash campaign, defect 4: the temp file of a released-claims write that
// a kill interrupted was never removed; only the checkpoint's own were.
func TestCleanUpRemovesTempFilesOfKilledWrites(t *testing.T) {
	dir := t.TempDir()
	st := &sharedState{s: claimstate.New()}
	c := preparer.Adapt[timeslicingfeature.Record](timeslicingfeature.New(&timeslicing.Memory{}, dir, st.read, false))
	released := filepath.Join(dir, timeslicingfeature.ReleasedFileName)
	left := released + ".tmp-12345"
	for path, content := range map[string]string{left: `["a"`, released: `["b"]`} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.CleanUp(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("temp file of a killed write still there (stat: %v)", err)
	}
	if data, err := os.ReadFile(released); err != nil || string(data) != `["b"]` {
		t.Errorf("released file after clean-up: %q, %v; want it untouched", data, err)
	}
}
