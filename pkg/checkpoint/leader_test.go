package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// blockingLeader starts an Update that, committed by its own caller (no
// one else is committing and the flock is free), blocks inside its
// mutation until release is called. It returns once the mutation runs.
func blockingLeader(t *testing.T, s *Store, uid string) (release func(), result <-chan error) {
	t.Helper()
	running, unblock := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.Update(context.Background(), func(st *claimstate.State) error {
			close(running)
			<-unblock
			return addClaim(testClaim(uid))(st)
		})
	}()
	select {
	case <-running:
	case <-time.After(10 * time.Second):
		t.Fatal("the leader's mutation never ran")
	}
	return func() { close(unblock) }, done
}

// TestLeaderHoldsTheFlock: the caller that commits its own Update holds
// the flock while its mutation runs, so another process (here another
// open file description of the lock file) is kept out: two plugin
// processes still serialise.
func TestLeaderHoldsTheFlock(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	release, done := blockingLeader(t, s, "leader")
	f, err := os.OpenFile(filepath.Join(e.dir, LockFileName), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); !errors.Is(err, unix.EWOULDBLOCK) {
		t.Errorf("flock by another process while the leader commits = %v, want EWOULDBLOCK", err)
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("leader's Update: %v", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Errorf("flock after the leader's commit: %v", err)
	}
	_ = f.Close()
	assertClaims(t, e, 1, "leader")
}

// TestFollowersCommitAfterTheLeader: Updates that arrive while a caller
// commits its own wait for it, then land together with one write; none
// is lost and the leader's is not written twice.
func TestFollowersCommitAfterTheLeader(t *testing.T) {
	const n = 16
	e := newTestEnv(t)
	s, _ := e.open(t)
	writes := s.Writes()
	release, leaderDone := blockingLeader(t, s, "c-leader")
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- s.Update(context.Background(), addClaim(testClaim(fmt.Sprintf("c-%02d", i)))) }()
	}
	waitQueued(t, s, n)
	release()
	if err := <-leaderDone; err != nil {
		t.Errorf("leader's Update: %v", err)
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("follower's Update: %v", err)
		}
	}
	if got := s.Writes() - writes; got != 2 {
		t.Errorf("the leader and %d followers took %d writes, want 2 (the leader's, then the followers' batch)", n, got)
	}
	assertClaims(t, e, n+1, "c-")
}

// TestCloseWaitsForTheLeader: Close returns only once a commit that a
// caller runs itself has finished, and that commit lands.
func TestCloseWaitsForTheLeader(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	release, leaderDone := blockingLeader(t, s, "leader")
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while a commit was in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	if err := <-leaderDone; err != nil {
		t.Errorf("leader's Update: %v", err)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return after the commit ended")
	}
	if err := s.Update(t.Context(), addClaim(testClaim("late"))); !errors.Is(err, ErrClosed) {
		t.Errorf("Update after Close = %v, want ErrClosed", err)
	}
	assertClaims(t, e, 1, "leader")
}

// TestCommitPanicReleasesTheFlock: a commit that panics outside a mutation
// (here the corrupt handler, which runs inside the commit that finds the
// damage) panics in the caller that led it, and leaves neither the flock
// held nor the Store committing: the next call is answered.
func TestCommitPanicReleasesTheFlock(t *testing.T) {
	e := newTestEnv(t)
	var panicking atomic.Bool
	s, _ := e.open(t, WithCorruptHandler(func(CorruptFile) {
		if panicking.Load() {
			panic("corrupt handler bug")
		}
	}))
	if err := s.Update(t.Context(), addClaim(testClaim("a"))); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.dir, FileName), []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	panicking.Store(true)
	func() {
		defer func() {
			if p := recover(); p == nil {
				t.Error("Update whose commit panicked returned")
			}
		}()
		_ = s.Update(t.Context(), addClaim(testClaim("b")))
	}()
	panicking.Store(false)

	f, err := os.OpenFile(filepath.Join(e.dir, LockFileName), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Errorf("flock after a commit panicked: %v", err)
	}
	_ = f.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := s.Update(ctx, addClaim(testClaim("c"))); !errors.Is(err, ErrNeedsAdoption) {
		t.Errorf("Update after a commit panicked = %v, want ErrNeedsAdoption (the file was lost)", err)
	}
}
