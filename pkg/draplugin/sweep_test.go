package draplugin_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	k8stesting "k8s.io/client-go/testing"

	"github.com/gpudra/gpudra/internal/shorttemp"
	"github.com/gpudra/gpudra/pkg/draplugin"
)

// TestPeriodicSweepBacksOffFromPresentClaims: the periodic sweep asks the
// API server about a claim it had after one sweep interval, then two,
// four and so on up to sixteen, even when its ticks come a little early
// or late; Sweep asks every time; and a Prepare refused because a claim
// already holds the device makes the sweep ask about every claim again at
// once.
func TestPeriodicSweepBacksOffFromPresentClaims(t *testing.T) {
	var clock atomic.Pointer[time.Time]
	now := time.Now()
	clock.Store(&now)
	h := newHarness(t, func(cfg *draplugin.Config) { cfg.Clock = func() time.Time { return *clock.Load() } })
	claim := h.claim("gpu-6")
	h.mustPrepare(claim)
	pod := claim.Status.ReservedFor[0]
	h.createPod(pod.Name, pod.UID)
	claimGets := func() int {
		n := 0
		for _, a := range h.client.Actions() {
			if get, ok := a.(k8stesting.GetAction); ok && get.GetResource().Resource == "resourceclaims" && get.GetName() == claim.Name {
				n++
			}
		}
		return n
	}

	var asked []int
	for i := range 48 {
		before := claimGets()
		draplugin.PeriodicSweep(h.driver, h.ctx)
		if claimGets() > before {
			asked = append(asked, i)
		}
		jitter := 10 * time.Second
		if i%2 == 1 {
			jitter = -jitter
		}
		later := clock.Load().Add(draplugin.DefaultSweepInterval + jitter)
		clock.Store(&later)
	}
	if want := []int{0, 1, 3, 7, 15, 31, 47}; !slices.Equal(asked, want) {
		t.Errorf("the periodic sweep asked about the claim at sweeps %v, want %v", asked, want)
	}
	if !strings.Contains(h.checkpoint(), string(claim.UID)) {
		t.Fatal("the claim was released")
	}

	before := claimGets()
	h.driver.Sweep(h.ctx)
	if got := claimGets() - before; got != 1 {
		t.Errorf("Sweep asked about the claim %d times, want 1", got)
	}

	// A second claim of the same GPU is refused; the sweep, woken, asks
	// about the holder at once although its back-off has 15 sweeps to go.
	before = claimGets()
	if msg := prepareError(h, h.claim("gpu-6")); !strings.Contains(msg, "already prepared for claim") {
		t.Fatalf("second claim of gpu-6: %q, want a refusal", msg)
	}
	deadline := time.Now().Add(10 * time.Second)
	for claimGets() == before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if claimGets() == before {
		t.Error("the refusal did not make the sweep ask about the holder")
	}
}

// TestSweepAfterClockSteppedBack: a started record or an orphaned CDI
// spec stamped in the future (the clock was stepped back since) counts as
// stamped when the sweep first sees it. It once stayed until the clock
// caught up, an hour here; now it goes one call timeout later, measured
// on the monotonic clock.
func TestSweepAfterClockSteppedBack(t *testing.T) {
	const timeout = 300 * time.Millisecond
	shortCalls := func(cfg *draplugin.Config) { cfg.CallTimeout = timeout }
	future := time.Now().Add(time.Hour)
	t.Run("started record", func(t *testing.T) {
		dir := shorttemp.Dir(t)
		uid := startedCheckpoint(t, dir, future)
		h := newHarnessIn(t, dir, shortCalls)
		h.driver.Sweep(h.ctx)
		if !strings.Contains(h.checkpoint(), uid) || len(h.specFiles()) != 1 {
			t.Fatalf("rolled back before a call timeout passed: specs %v, checkpoint %s", h.specFiles(), h.checkpoint())
		}
		time.Sleep(timeout + 100*time.Millisecond)
		h.driver.Sweep(h.ctx)
		if strings.Contains(h.checkpoint(), uid) || len(h.specFiles()) != 0 {
			t.Errorf("not rolled back a call timeout after it was first seen: specs %v, checkpoint %s", h.specFiles(), h.checkpoint())
		}
	})
	t.Run("orphaned spec", func(t *testing.T) {
		h := newHarness(t, shortCalls)
		orphan := filepath.Join(h.cfg.CDIDir, "k8s.gpu.nvidia.com-claim_dead-beef.json")
		if err := os.WriteFile(orphan, []byte(`{"cdiVersion":"0.5.0","kind":"k8s.gpu.nvidia.com/claim","devices":[]}`), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(orphan, future, future); err != nil {
			t.Fatal(err)
		}
		h.driver.Sweep(h.ctx)
		if _, err := os.Stat(orphan); err != nil {
			t.Fatalf("removed before a call timeout passed: %v", err)
		}
		time.Sleep(timeout + 100*time.Millisecond)
		h.driver.Sweep(h.ctx)
		if _, err := os.Stat(orphan); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("not removed a call timeout after it was first seen: %v", err)
		}
	})
}
