package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// TestGroupCommit queues 64 Updates while another process holds the lock:
// once it lets go, they all land with one write.
func TestGroupCommit(t *testing.T) {
	const n = 64
	e := newTestEnv(t)
	s, _ := e.open(t)
	release := holdLock(t, e.dir)
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- s.Update(context.Background(), addClaim(testClaim(fmt.Sprintf("c%02d", i)))) }()
	}
	waitQueued(t, s, n)
	writes := s.writes.Load()
	release()
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("Update: %v", err)
		}
	}
	if got := s.writes.Load() - writes; got != 1 {
		t.Errorf("%d Updates took %d writes, want 1", n, got)
	}
	assertClaims(t, e, n, "c")
}

// TestGroupCommitIsolatesMutations: in one batch, failing mutations are
// discarded alone and the others apply in order.
func TestGroupCommitIsolatesMutations(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	errRefused := errors.New("refused")
	mutations := []func(*claimstate.State) error{
		addClaim(testClaim("a")),
		func(st *claimstate.State) error {
			delete(st.Claims, "a")
			st.Claims["bad"] = testClaim("bad")
			return errRefused
		},
		func(st *claimstate.State) error {
			st.Claims["a"].Phase = claimstate.PrepareStarted // sees the first mutation
			return nil
		},
		func(st *claimstate.State) error {
			st.Claims["a"].Phase = "Bogus"
			return nil
		},
		addClaim(testClaim("b")),
	}
	release := holdLock(t, e.dir)
	errs := make([]chan error, len(mutations))
	for i, m := range mutations {
		errs[i] = make(chan error, 1)
		go func() { errs[i] <- s.Update(context.Background(), m) }()
		waitQueued(t, s, i+1) // queue in a known order
	}
	writes := s.writes.Load()
	release()
	for i, want := range []string{"", "refused", "", "unknown phase", ""} {
		err := <-errs[i]
		if (want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), want)) {
			t.Errorf("mutation %d: error %v, want %q", i, err, want)
		}
	}
	if got := s.writes.Load() - writes; got != 1 {
		t.Errorf("batch took %d writes, want 1", got)
	}
	got := mustRead(t, s)
	if len(got.Claims) != 2 || got.Claims["a"] == nil || got.Claims["b"] == nil || got.Claims["a"].Phase != claimstate.PrepareStarted {
		t.Errorf("claims = %v, want a (PrepareStarted) and b", got.Claims)
	}
}

// TestConcurrentUpdates runs Updates free from 64 goroutines.
func TestConcurrentUpdates(t *testing.T) {
	const goroutines, each = 64, 4
	e := newTestEnv(t)
	s, _ := e.open(t)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				if err := s.Update(context.Background(), addClaim(testClaim(fmt.Sprintf("g%02d-%d", g, i)))); err != nil {
					t.Errorf("Update: %v", err)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d Updates took %d writes", goroutines*each, s.writes.Load())
	assertClaims(t, e, goroutines*each, "g")
}

// TestTwoStoresInterleave runs two Stores on one directory, as two plugin
// processes during a rolling update, each adding claims of its own.
func TestTwoStoresInterleave(t *testing.T) {
	const goroutines, each = 8, 25
	e := newTestEnv(t)
	stores := make([]*Store, 2)
	for i := range stores {
		stores[i], _ = e.open(t)
	}
	var wg sync.WaitGroup
	for g := range goroutines {
		s := stores[g%2]
		wg.Go(func() {
			for i := range each {
				if err := s.Update(context.Background(), addClaim(testClaim(fmt.Sprintf("s%d-g%d-%02d", g%2, g, i)))); err != nil {
					t.Errorf("Update: %v", err)
				}
			}
		})
	}
	wg.Wait()
	for i, s := range stores {
		if got := mustRead(t, s); len(got.Claims) != goroutines*each {
			t.Errorf("store %d reads %d claims, want %d", i, len(got.Claims), goroutines*each)
		}
	}
	assertClaims(t, e, goroutines*each, "s")
}

// helperConfig tells TestHelperProcess what to do.
type helperConfig struct {
	Dir, BootIDPath, StatPath string
	N                         int
}

const helperEnv = "GPUDRA_CHECKPOINT_HELPER"

// TestHelperProcess is the child of TestTwoProcesses: it adds claims
// child-000..., starting in earnest once the parent has written.
func TestHelperProcess(t *testing.T) {
	spec := os.Getenv(helperEnv)
	if spec == "" {
		t.Skip("child process of TestTwoProcesses")
	}
	var cfg helperConfig
	if err := json.Unmarshal([]byte(spec), &cfg); err != nil {
		t.Fatal(err)
	}
	s, _, err := Open(t.Context(), cfg.Dir, WithBootIDPath(cfg.BootIDPath), WithProcStatPath(cfg.StatPath))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	for i := range cfg.N {
		if err := s.Update(t.Context(), addClaim(testClaim(fmt.Sprintf("child-%03d", i)))); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			waitForClaim(t, s, "parent-000")
		}
	}
}

// TestTwoProcesses runs Updates from a child process (this test binary,
// re-executed) and from this one at the same time: none may be lost.
func TestTwoProcesses(t *testing.T) {
	const n = 100
	e := newTestEnv(t)
	s, _ := e.open(t)
	spec, err := json.Marshal(helperConfig{Dir: e.dir, BootIDPath: e.bootIDPath, StatPath: e.statPath, N: n})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), helperEnv+"="+string(spec))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	waitForClaim(t, s, "child-000") // the child now waits for parent-000
	var childSeen []int
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := g; i < n; i += 4 {
				if err := s.Update(context.Background(), addClaim(testClaim(fmt.Sprintf("parent-%03d", i)))); err != nil {
					t.Errorf("Update: %v", err)
				}
				if g == 0 {
					childSeen = append(childSeen, countPrefix(mustRead(t, s), "child-"))
				}
			}
		})
	}
	wg.Wait()
	if err := <-exited; err != nil {
		t.Fatalf("child process: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "--- PASS: TestHelperProcess") {
		t.Fatalf("child process did not run its updates:\n%s", out.String())
	}
	t.Logf("child claims seen by the parent while it wrote: %v", childSeen)
	assertClaims(t, e, 2*n, "")
	if got := mustRead(t, s); countPrefix(got, "child-") != n || countPrefix(got, "parent-") != n {
		t.Errorf("parent reads %d child and %d parent claims, want %d each", countPrefix(got, "child-"), countPrefix(got, "parent-"), n)
	}
}

func waitForClaim(tb testing.TB, s *Store, uid string) {
	tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for mustRead(tb, s).Claims[uid] == nil {
		if time.Now().After(deadline) {
			tb.Fatalf("claim %s never appeared", uid)
		}
		time.Sleep(time.Millisecond)
	}
}

func countPrefix(st *claimstate.State, prefix string) int {
	n := 0
	for uid := range st.Claims {
		if strings.HasPrefix(uid, prefix) {
			n++
		}
	}
	return n
}

// assertClaims checks, through a fresh Store, that the file holds n claims
// with the given UID prefix, each intact.
func assertClaims(tb testing.TB, e *testEnv, n int, prefix string) {
	tb.Helper()
	s, report := e.open(tb)
	if report != (OpenReport{}) {
		tb.Errorf("fresh Open report = %+v, want zero", report)
	}
	got := mustRead(tb, s)
	if c := countPrefix(got, prefix); c != n || len(got.Claims) != n {
		tb.Errorf("file holds %d claims (%d with prefix %q), want %d", len(got.Claims), c, prefix, n)
	}
	for uid, c := range got.Claims {
		if want := testClaim(uid); c.Name != want.Name || len(c.Devices) != len(want.Devices) {
			tb.Errorf("claim %s = %+v, want %+v", uid, c, want)
		}
	}
}
