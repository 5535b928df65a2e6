package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpudra/gpudra/internal/lockedfile"
	"github.com/gpudra/gpudra/pkg/claimstate"
)

// corruptLog records what a Store's corrupt handler is told.
type corruptLog struct {
	mu    sync.Mutex
	files []CorruptFile
}

func (c *corruptLog) option() Option {
	return WithCorruptHandler(func(cf CorruptFile) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.files = append(c.files, cf)
	})
}

func (c *corruptLog) get() []CorruptFile {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]CorruptFile(nil), c.files...)
}

func (e *testEnv) markerPath() string { return filepath.Join(e.dir, AdoptPendingFileName) }

func exists(tb testing.TB, path string) bool {
	tb.Helper()
	_, err := os.Lstat(path)
	if err != nil && !os.IsNotExist(err) {
		tb.Fatal(err)
	}
	return err == nil
}

// TestDamageSeenByAnotherStore: two Stores share the directory, as two
// plugin processes during a rolling update. The one that finds the damage
// moves the file aside; the other must not take the missing file for "no
// claims" but needs adoption too, until either recovers.
func TestDamageSeenByAnotherStore(t *testing.T) {
	e := newTestEnv(t)
	var logA, logB corruptLog
	a, _ := e.open(t, logA.option())
	b, _ := e.open(t, logB.option())
	ctx := t.Context()
	if err := a.Update(ctx, addClaim(testClaim("held"))); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, b); got.Claims["held"] == nil {
		t.Fatal("b does not see claim held")
	}
	if err := lockedfile.Write(e.path(), []byte("{garbage")); err != nil {
		t.Fatal(err)
	}

	if err := b.Update(ctx, addClaim(testClaim("b"))); !errors.Is(err, ErrNeedsAdoption) {
		t.Fatalf("b.Update after the damage = %v, want ErrNeedsAdoption", err)
	}
	kept := movedAside(t, e.dir)
	if len(kept) != 1 {
		t.Fatalf("moved-aside files %v, want one", kept)
	}
	if err := a.Update(ctx, addClaim(testClaim("a"))); !errors.Is(err, ErrNeedsAdoption) {
		t.Errorf("a.Update once b moved the file aside = %v, want ErrNeedsAdoption", err)
	}
	if !a.NeedsAdoption() || !b.NeedsAdoption() {
		t.Errorf("NeedsAdoption a %v, b %v; want both", a.NeedsAdoption(), b.NeedsAdoption())
	}
	for name, log := range map[string]*corruptLog{"a": &logA, "b": &logB} {
		if files := log.get(); len(files) != 1 || files[0].Path != kept[0] {
			t.Errorf("%s's corrupt handler got %+v, want one call naming %s", name, files, kept[0])
		}
	}
	if kept := movedAside(t, e.dir); len(kept) != 1 {
		t.Errorf("moved-aside files %v, want still one", kept)
	}

	// A third process starting meanwhile is told at Open.
	c, report := e.open(t)
	if report.Corrupt == nil || report.Corrupt.Path != kept[0] || !strings.Contains(report.Corrupt.Err.Error(), "not adopted yet") {
		t.Errorf("report of an Open while adoption is pending = %+v, want Corrupt naming %s", report, kept[0])
	}
	if !c.NeedsAdoption() {
		t.Error("c.NeedsAdoption = false")
	}

	if err := a.Recover(ctx, addClaim(testClaim("held"))); err != nil {
		t.Fatalf("a.Recover: %v", err)
	}
	for name, s := range map[string]*Store{"b": b, "c": c} {
		if got, err := s.Read(ctx); err != nil || len(got.Claims) != 1 || got.Claims["held"] == nil {
			t.Errorf("%s.Read after a recovered = %v, %v; want claim held", name, got, err)
		}
		if s.NeedsAdoption() {
			t.Errorf("%s.NeedsAdoption after a recovered = true", name)
		}
	}
	if err := b.Update(ctx, addClaim(testClaim("b"))); err != nil {
		t.Errorf("b.Update after a recovered: %v", err)
	}
	// Recovering again (b's owner adopting too) is harmless.
	if err := b.Recover(ctx, addClaim(testClaim("held"))); err != nil {
		t.Errorf("b.Recover after a recovered: %v", err)
	}
	assertClaims(t, e, 2, "")
}

// TestConcurrentUpdatesDuringDamage: Updates and Reads run free while the
// file is damaged and recovered; none ever sees the state without the
// claim that was held before and adopted after.
func TestConcurrentUpdatesDuringDamage(t *testing.T) {
	const workers = 6
	e := newTestEnv(t)
	var log corruptLog
	s, _ := e.open(t, log.option())
	ctx := context.Background()
	if err := s.Update(ctx, addClaim(testClaim("held"))); err != nil {
		t.Fatal(err)
	}
	var sawEmpty, applied, refused atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer halt() // also when the test fails early
	for w := range workers {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var err error
				if w%3 == 2 {
					var st *claimstate.State
					if st, err = s.Read(ctx); err == nil && st.Claims["held"] == nil {
						sawEmpty.Add(1)
					}
				} else {
					uid := fmt.Sprintf("w%d-%d", w, i)
					err = s.Update(ctx, func(st *claimstate.State) error {
						if st.Claims["held"] == nil {
							sawEmpty.Add(1)
						}
						st.Claims[uid] = testClaim(uid)
						return nil
					})
				}
				switch {
				case err == nil:
					applied.Add(1)
				case errors.Is(err, ErrNeedsAdoption):
					refused.Add(1)
					time.Sleep(time.Millisecond)
				default:
					t.Errorf("worker %d: %v", w, err)
					return
				}
			}
		})
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitFor("updates before the damage", func() bool { return applied.Load() >= 20 })
	// Damaged under the lock, so that no write in flight replaces the
	// damage before anyone sees it.
	release := holdLock(t, e.dir)
	if err := lockedfile.Write(e.path(), []byte("{garbage")); err != nil {
		t.Fatal(err)
	}
	release()
	waitFor("refusals", func() bool { return refused.Load() >= 20 })
	err := s.Recover(ctx, func(st *claimstate.State) error {
		if len(st.Claims) != 0 {
			t.Errorf("Recover sees %d claims, want none", len(st.Claims))
		}
		st.Claims["held"] = testClaim("held")
		return nil
	})
	if err != nil {
		t.Fatalf("Recover: %v", err)
	}
	after := applied.Load()
	waitFor("updates after Recover", func() bool { return applied.Load() >= after+20 })
	halt()
	if n := sawEmpty.Load(); n != 0 {
		t.Errorf("%d mutations or reads saw the state without claim held", n)
	}
	if n := len(log.get()); n != 1 {
		t.Errorf("corrupt handler called %d times, want once", n)
	}
	t.Logf("%d applied, %d refused", applied.Load(), refused.Load())
}

// TestRecoverInBatchOrder: requests queued while adoption is pending fail
// up to the first Recover that succeeds; those after it apply to the
// recovered state.
func TestRecoverInBatchOrder(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	ctx := context.Background()
	if err := s.Update(ctx, addClaim(testClaim("held"))); err != nil {
		t.Fatal(err)
	}
	if err := lockedfile.Write(e.path(), []byte("{garbage")); err != nil {
		t.Fatal(err)
	}
	errRefused := errors.New("refused")
	var ranBefore atomic.Bool
	type call struct {
		recover bool
		mutate  func(*claimstate.State) error
		want    error // nil, ErrNeedsAdoption or errRefused
	}
	calls := []call{
		{false, func(*claimstate.State) error { ranBefore.Store(true); return nil }, ErrNeedsAdoption},
		{true, func(*claimstate.State) error { return errRefused }, errRefused},
		{false, func(*claimstate.State) error { ranBefore.Store(true); return nil }, ErrNeedsAdoption},
		{true, addClaim(testClaim("held")), nil},
		{false, func(st *claimstate.State) error {
			if st.Claims["held"] == nil {
				return errors.New("update after Recover does not see the recovered state")
			}
			st.Claims["after"] = testClaim("after")
			return nil
		}, nil},
		{true, addClaim(testClaim("again")), nil},
	}
	release := holdLock(t, e.dir)
	errs := make([]chan error, len(calls))
	for i, c := range calls {
		errs[i] = make(chan error, 1)
		go func() {
			if c.recover {
				errs[i] <- s.Recover(ctx, c.mutate)
			} else {
				errs[i] <- s.Update(ctx, c.mutate)
			}
		}()
		waitQueued(t, s, i+1)
	}
	release()
	for i, c := range calls {
		if err := <-errs[i]; !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("call %d = %v, want %v", i, err, c.want)
		}
	}
	if ranBefore.Load() {
		t.Error("an Update queued before the Recover ran")
	}
	if got := mustRead(t, s); len(got.Claims) != 3 {
		t.Errorf("claims = %v, want held, after, again", got.Claims)
	}
}

// TestRecoverFailureKeepsAdoptionPending: a Recover whose mutation fails,
// or leaves an invalid state, recovers nothing.
func TestRecoverFailureKeepsAdoptionPending(t *testing.T) {
	e := newTestEnv(t)
	e.writeCheckpoint(t, "{garbage", false)
	s, report := e.open(t)
	if report.Corrupt == nil {
		t.Fatalf("report = %+v, want Corrupt", report)
	}
	for _, mutate := range []func(*claimstate.State) error{
		func(*claimstate.State) error { return errors.New("cannot list CDI specs") },
		func(st *claimstate.State) error { st.Claims["x"] = testClaim("y"); return nil },
	} {
		if err := s.Recover(t.Context(), mutate); err == nil {
			t.Error("failing Recover succeeded")
		}
		if !s.NeedsAdoption() || !exists(t, e.markerPath()) || exists(t, e.path()) {
			t.Errorf("after a failed Recover: NeedsAdoption %v, marker %v, file %v; want marker and no file",
				s.NeedsAdoption(), exists(t, e.markerPath()), exists(t, e.path()))
		}
		if err := s.Update(t.Context(), addClaim(testClaim("x"))); !errors.Is(err, ErrNeedsAdoption) {
			t.Errorf("Update after a failed Recover = %v, want ErrNeedsAdoption", err)
		}
	}
}

// TestRecoverWithoutLoss: with nothing to adopt, Recover is an Update.
func TestRecoverWithoutLoss(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	if err := s.Recover(t.Context(), addClaim(testClaim("u"))); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, s); got.Claims["u"] == nil {
		t.Errorf("state = %v, want claim u", got.Claims)
	}
}

// TestAdoptionPendingAcrossRestart: a process that dies before recovering
// leaves the marker; the next one is told at Open and must adopt too.
func TestAdoptionPendingAcrossRestart(t *testing.T) {
	t.Run("file moved aside", func(t *testing.T) {
		e := newTestEnv(t)
		e.writeCheckpoint(t, "{garbage", false)
		s, report := e.open(t)
		if report.Corrupt == nil {
			t.Fatalf("report = %+v, want Corrupt", report)
		}
		moved := report.Corrupt.Path
		if exists(t, e.path()) {
			t.Error("Open wrote a file before the claims were adopted")
		}
		_ = s.Close()

		s, report = e.open(t)
		if report.Corrupt == nil || report.Corrupt.Path != moved || report.Migrated != "" || report.BootIDChanged {
			t.Errorf("report after a restart = %+v, want Corrupt naming %s only", report, moved)
		}
		if _, err := s.Read(t.Context()); !errors.Is(err, ErrNeedsAdoption) || !strings.Contains(err.Error(), moved) {
			t.Errorf("Read = %v, want ErrNeedsAdoption naming %s", err, moved)
		}
		if err := s.Recover(t.Context(), addClaim(testClaim("adopted"))); err != nil {
			t.Fatal(err)
		}
		_ = s.Close()
		if _, report := e.open(t); report != (OpenReport{}) {
			t.Errorf("report after Recover = %+v, want zero", report)
		}
	})

	t.Run("died after writing the recovered state", func(t *testing.T) {
		e := newTestEnv(t)
		data, err := encode("boot-a", &claimstate.State{Claims: map[string]*claimstate.Claim{"adopted": testClaim("adopted")}})
		if err != nil {
			t.Fatal(err)
		}
		e.writeCheckpoint(t, string(data), false)
		writeFile(t, e.markerPath(), `{"bootID":"boot-a","movedTo":"/x","reason":"r","since":"2026-11-22T10:00:00Z"}`)
		s, report := e.open(t)
		if report.Corrupt == nil {
			t.Errorf("report = %+v, want Corrupt (adoption pending)", report)
		}
		err = s.Recover(t.Context(), func(st *claimstate.State) error {
			if st.Claims["adopted"] == nil {
				t.Errorf("Recover sees %v, want the state the file holds", st.Claims)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if exists(t, e.markerPath()) || s.NeedsAdoption() {
			t.Error("adoption still pending after Recover")
		}
	})
}

// TestAdoptPendingMarkerOfPreviousBoot: a reboot reset what the lost file
// described; its marker is void and removed.
func TestAdoptPendingMarkerOfPreviousBoot(t *testing.T) {
	tests := []struct {
		name, content string
		previousBoot  bool
		wantPending   bool
	}{
		{"other boot ID", `{"bootID":"boot-old","movedTo":"/x","reason":"r","since":"2026-11-22T10:00:00Z"}`, false, false},
		{"unreadable, older than the boot", `{"boot`, true, false},
		{"unreadable, of this boot", `{"boot`, false, true},
		{"this boot", `{"bootID":"boot-a","movedTo":"/x","reason":"r","since":"2026-11-22T10:00:00Z"}`, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t)
			writeFile(t, e.markerPath(), tt.content)
			if tt.previousBoot {
				old := e.bootTime.Add(-time.Minute)
				if err := os.Chtimes(e.markerPath(), old, old); err != nil {
					t.Fatal(err)
				}
			}
			s, report := e.open(t)
			if (report.Corrupt != nil) != tt.wantPending || s.NeedsAdoption() != tt.wantPending || exists(t, e.markerPath()) != tt.wantPending {
				t.Errorf("report %+v, NeedsAdoption %v, marker there %v; want pending %v",
					report, s.NeedsAdoption(), exists(t, e.markerPath()), tt.wantPending)
			}
		})
	}
}

// TestRequireAdoption: an owner that finds claims on the node the checkpoint
// does not record, and cannot adopt them, makes the checkpoint need
// adoption: every call but Recover fails, in this Store, in another sharing
// the directory and in a Store opened later (a restarted plugin), while the
// file and its claims stay; the first Recover, which sees those claims,
// ends it for all.
func TestRequireAdoption(t *testing.T) {
	e := newTestEnv(t)
	ctx := t.Context()
	a, _ := e.open(t)
	b, _ := e.open(t)
	if err := a.Update(ctx, addClaim(testClaim("held"))); err != nil {
		t.Fatal(err)
	}
	before := readFile(t, e.path())

	if err := a.RequireAdoption(ctx, "spec of claim x names a record this plugin does not know"); err != nil {
		t.Fatal(err)
	}
	if err := a.RequireAdoption(ctx, "again"); err != nil {
		t.Fatalf("RequireAdoption while adoption is pending: %v", err)
	}
	if err := a.Update(ctx, addClaim(testClaim("a"))); !errors.Is(err, ErrNeedsAdoption) || !strings.Contains(err.Error(), "does not know") {
		t.Errorf("a.Update = %v, want ErrNeedsAdoption with the reason", err)
	}
	if _, err := b.Read(ctx); !errors.Is(err, ErrNeedsAdoption) {
		t.Errorf("b.Read = %v, want ErrNeedsAdoption", err)
	}
	c, report := e.open(t)
	if report.Corrupt == nil || report.Corrupt.Path != "" || !strings.Contains(report.Corrupt.Err.Error(), "does not know") {
		t.Errorf("a Store opened meanwhile reports %+v, want the pending adoption with its reason", report.Corrupt)
	}
	if got := readFile(t, e.path()); got != before || len(movedAside(t, e.dir)) != 0 {
		t.Errorf("the checkpoint was changed or moved aside:\n%s", got)
	}

	err := c.Recover(ctx, func(st *claimstate.State) error {
		if st.Claims["held"] == nil {
			return errors.New("the recorded claim is not in the state Recover sees")
		}
		st.Claims["x"] = testClaim("x")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]*Store{"a": a, "b": b, "c": c} {
		if st, err := s.Read(ctx); err != nil || st.Claims["held"] == nil || st.Claims["x"] == nil {
			t.Errorf("%s after Recover: %v, claims %v", name, err, st)
		}
	}
	if exists(t, e.markerPath()) {
		t.Error("marker left after Recover")
	}
}
