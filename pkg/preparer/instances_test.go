package preparer_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// The tests in this file run two rigs on one directory: two plugin
// instances of a rolling update, each with its own Store, CDI writer and
// preparer, as two processes would have (the claim locks are open file
// description locks, which exclude each other between descriptors of one
// process as between processes).

// interruptOnce returns a fault hook that, the first time step is reached,
// starts call in another goroutine and gives it up to wait to finish: time
// enough to barge in, which a call for the same claim must not.
func interruptOnce(step string, wait time.Duration, call func() error) (hook func(string) error, result <-chan error) {
	res := make(chan error, 1)
	var once sync.Once
	return func(s string) error {
		if s != step {
			return nil
		}
		once.Do(func() {
			done := make(chan struct{})
			go func() {
				res <- call()
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(wait):
			}
		})
		return nil
	}, res
}

// TestTwoInstancesSerializeClaimCalls starts a call for a claim in one
// instance while the other instance's call for it is under way: it waits
// for that call and then does its own work in full, so the claim ends as
// the call that returned last says.
func TestTwoInstancesSerializeClaimCalls(t *testing.T) {
	const barge = 200 * time.Millisecond
	t.Run("Unprepare during Prepare", func(t *testing.T) {
		dir := t.TempDir()
		b := newRig(t, dir, nil)
		hook, unprepared := interruptOnce("alpha.Apply", barge, b.unprepare)
		a := newRig(t, dir, hook)
		if err := a.prepare(); err != nil {
			t.Fatalf("prepare: %v", err)
		}
		if err := <-unprepared; err != nil {
			t.Fatalf("unprepare: %v", err)
		}
		a.checkClean()
	})
	t.Run("Prepare during Unprepare", func(t *testing.T) {
		dir := t.TempDir()
		b := newRig(t, dir, nil)
		var armed bool
		hook, prepared := interruptOnce("beta.Undo", barge, b.prepare)
		a := newRig(t, dir, func(s string) error {
			if !armed {
				return nil
			}
			return hook(s)
		})
		if err := a.prepare(); err != nil {
			t.Fatalf("prepare: %v", err)
		}
		armed = true
		if err := a.unprepare(); err != nil {
			t.Fatalf("unprepare: %v", err)
		}
		if err := <-prepared; err != nil {
			t.Fatalf("prepare: %v", err)
		}
		a.checkPrepared()
	})
}

// TestTwoInstancesRacePrepareAndUnprepare races a Prepare in one instance
// with an Unprepare of the same claim in the other, many times. Each pair
// must leave the claim whole, as one order of the two calls would: fully
// prepared or not at all, never a record without its hardware or
// hardware without its record.
func TestTwoInstancesRacePrepareAndUnprepare(t *testing.T) {
	rounds := 200
	if testing.Short() {
		rounds = 50
	}
	dir := t.TempDir()
	rigs := [2]*rig{newRig(t, dir, nil), newRig(t, dir, nil)}
	uid := string(testClaim().UID)
	var prepared, clean int
	for i := range rounds {
		p, u := rigs[i%2], rigs[(i+1)%2]
		var wg sync.WaitGroup
		var perr, uerr error
		wg.Go(func() { perr = p.prepare() })
		wg.Go(func() { uerr = u.unprepare() })
		wg.Wait()
		if perr != nil || uerr != nil {
			t.Fatalf("round %d: prepare: %v; unprepare: %v", i, perr, uerr)
		}
		state, err := p.store.Read(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if state.Claims[uid] == nil {
			clean++
			p.checkClean()
		} else {
			prepared++
			p.checkPrepared()
		}
		if t.Failed() {
			t.Fatalf("round %d left the claim torn (%d rounds whole before)", i, i)
		}
		// Start the next round from nothing.
		if err := u.unprepare(); err != nil {
			t.Fatal(err)
		}
		u.checkClean()
	}
	t.Logf("%d rounds ended prepared, %d clean", prepared, clean)
}

// TestClaimLockWaitEndsWithContext holds a claim in one instance: a call
// for it in the other waits until its context ends, fails with the
// context's error having done nothing, and works once the claim is free.
// A different claim is not held up meanwhile.
func TestClaimLockWaitEndsWithContext(t *testing.T) {
	dir := t.TempDir()
	a, b := newRig(t, dir, nil), newRig(t, dir, nil)
	uid := string(testClaim().UID)
	unlock, err := a.prep.LockClaim(context.Background(), uid)
	if err != nil {
		t.Fatal(err)
	}

	other, err := b.prep.LockClaim(context.Background(), "another-claim")
	if err != nil {
		t.Fatalf("a different claim: %v", err)
	}
	other()

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = b.prep.Prepare(ctx, testClaim())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("prepare while the other instance holds the claim = %v, want %v", err, context.DeadlineExceeded)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Errorf("prepare returned %v after its context ended", waited)
	}
	b.checkClean()

	// A second waiter in the same instance queues behind nothing stale.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if _, err := b.prep.LockClaim(ctx2, uid); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second wait = %v, want %v", err, context.DeadlineExceeded)
	}

	unlock()
	if err := b.prepare(); err != nil {
		t.Fatalf("prepare once the claim is free: %v", err)
	}
	b.checkPrepared()
	state, err := a.store.Read(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c := state.Claims[uid]; c == nil || c.Phase != claimstate.PrepareCompleted {
		t.Fatalf("the other instance sees %v, want the completed record", slices.Collect(maps.Keys(state.Claims)))
	}
}
