package checkpoint

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// lockWithin tries LockClaim for d: the unlock function, or nil when ctx
// ended first.
func lockWithin(tb testing.TB, s *Store, uid string, d time.Duration) func() {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	unlock, err := s.LockClaim(ctx, uid)
	if errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	if err != nil {
		tb.Fatalf("LockClaim(%s): %v", uid, err)
	}
	return unlock
}

// TestLockClaimAcrossStores: two Stores on one directory, as two plugin
// processes: one claim's lock excludes the other Store until let go, a
// different claim's does not, and a wait whose context ended leaves the
// lock free once the holder lets it go.
func TestLockClaimAcrossStores(t *testing.T) {
	e := newTestEnv(t)
	a, _ := e.open(t)
	b, _ := e.open(t)

	unlockA := lockWithin(t, a, "claim-1", time.Second)
	if unlockA == nil {
		t.Fatal("a free claim could not be locked")
	}
	if u := lockWithin(t, b, "claim-1", 50*time.Millisecond); u != nil {
		u()
		t.Fatal("the other Store locked a held claim")
	}
	if u := lockWithin(t, b, "claim-2", time.Second); u == nil {
		t.Fatal("a different claim was held up")
	} else {
		u()
	}

	got := make(chan func(), 1)
	go func() { got <- lockWithin(t, b, "claim-1", 10*time.Second) }()
	select {
	case u := <-got:
		t.Fatalf("the other Store locked a held claim (%v)", u != nil)
	case <-time.After(50 * time.Millisecond):
	}
	unlockA()
	unlockA() // a second call does nothing
	unlockB := <-got
	if unlockB == nil {
		t.Fatal("a waiter did not get the lock once it was let go")
	}
	if u := lockWithin(t, a, "claim-1", 50*time.Millisecond); u != nil {
		u()
		t.Fatal("a second call of the first unlock let the other Store's lock go")
	}
	unlockB()

	// A wait that gave up gets the lock in the background and lets it go.
	unlockA = lockWithin(t, a, "claim-1", time.Second)
	if u := lockWithin(t, b, "claim-1", 20*time.Millisecond); u != nil {
		t.Fatal("the other Store locked a held claim")
	}
	unlockA()
	if u := lockWithin(t, b, "claim-1", 5*time.Second); u == nil {
		t.Fatal("a wait that gave up kept the claim locked")
	} else {
		u()
	}
	if _, err := a.LockClaim(canceledContext(), "claim-1"); !errors.Is(err, context.Canceled) {
		t.Fatalf("LockClaim with an ended context = %v, want %v", err, context.Canceled)
	}
}

func canceledContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

const claimLockHelperEnv = "GPUDRA_CLAIM_LOCK_HELPER"

// TestClaimLockHelperProcess is the child of TestLockClaimKilledHolder: it
// takes a claim's lock, says so, and waits to be killed.
func TestClaimLockHelperProcess(t *testing.T) {
	dir := os.Getenv(claimLockHelperEnv)
	if dir == "" {
		t.Skip("child process of TestLockClaimKilledHolder")
	}
	e := newTestEnv(t)
	e.dir = dir
	s, _ := e.open(t)
	if _, err := s.LockClaim(t.Context(), "claim-1"); err != nil {
		t.Fatal(err)
	}
	fmt.Println("locked")
	select {}
}

// TestLockClaimKilledHolder: a process killed while it holds a claim's
// lock (SIGKILL, as in a rolling update gone wrong) holds it no longer.
func TestLockClaimKilledHolder(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestClaimLockHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), claimLockHelperEnv+"="+e.dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "locked" {
		t.Fatalf("child: %q, %v", line, err)
	}
	if u := lockWithin(t, s, "claim-1", 50*time.Millisecond); u != nil {
		t.Fatal("locked a claim another process holds")
	}
	got := make(chan func(), 1)
	go func() { got <- lockWithin(t, s, "claim-1", 10*time.Second) }()
	_ = cmd.Process.Kill()
	if u := <-got; u == nil {
		t.Fatal("a killed process kept the claim locked")
	} else {
		u()
	}
}

// BenchmarkLockClaim: taking and letting go of a free claim's lock, what
// each Prepare and Unprepare pays for excluding other plugin instances.
func BenchmarkLockClaim(b *testing.B) {
	e := newTestEnv(b)
	s, _ := e.open(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		unlock, err := s.LockClaim(ctx, "11111111-2222-3333-4444-555555555555")
		if err != nil {
			b.Fatal(err)
		}
		unlock()
	}
}
