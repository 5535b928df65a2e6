package mps_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/gpudra/gpudra/internal/mpsfake"
	"github.com/gpudra/gpudra/pkg/mps"
)

func TestSuperviseRestartsACrashedDaemonWithItsLimits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		spec mps.Spec
	}{
		{name: "thread percentage", spec: mps.Spec{ID: "claim-a", DeviceUUIDs: []string{gpu0}, ActiveThreadPercentage: intp(20)}},
		{name: "memory on two GPUs, multi-user", spec: mps.Spec{ID: "claim-b", DeviceUUIDs: []string{gpu0, gpu1}, MultiUser: true,
			PinnedMemoryLimits: map[string]int64{gpu0: 2 << 30, gpu1: 3 << 30}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			events := &eventLog{}
			m := newManager(t, newRoot(t), events)
			d, err := m.Start(ctx, tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.SuperviseOnce(ctx); err != nil || launches(t, d.Dirs) != 1 {
				t.Fatalf("SuperviseOnce of a healthy daemon: %v, %d launches", err, launches(t, d.Dirs))
			}

			crash(t, d.PID)
			if err := m.SuperviseOnce(ctx); err != nil {
				t.Fatalf("SuperviseOnce: %v", err)
			}
			list, err := m.List(ctx)
			if err != nil || len(list) != 1 || !list[0].Running {
				t.Fatalf("after restart: %+v, %v", list, err)
			}
			now := list[0]
			if now.PID == d.PID || now.Restarts != 1 || launches(t, d.Dirs) != 2 {
				t.Errorf("after restart: pid %d (was %d), restarts %d, launches %d; want a new daemon, 1 restart, 2 launches",
					now.PID, d.PID, now.Restarts, launches(t, d.Dirs))
			}
			r := record(t, d.Dirs)
			if r.PID != now.PID {
				t.Errorf("fake record from pid %d, want the new daemon %d", r.PID, now.PID)
			}
			wantLimits(t, r, tc.spec)
			if r.MultiUser != tc.spec.MultiUser {
				t.Errorf("restarted daemon multi-user = %v, want %v", r.MultiUser, tc.spec.MultiUser)
			}
			if got := events.types(tc.spec.ID); !slices.Equal(got, []mps.EventType{mps.EventStarted, mps.EventRestarted}) {
				t.Errorf("events = %v, want [Started Restarted]", got)
			}
		})
	}
}

func TestSuperviseLoopRunsOnTheClock(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	clk := testingclock.NewFakeClock(time.Unix(1_800_000_000, 0))
	events := &eventLog{}
	m := newManager(t, newRoot(t), events, mps.WithClock(clk))
	d, err := m.Start(ctx, mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}, ActiveThreadPercentage: intp(70)})
	if err != nil {
		t.Fatal(err)
	}
	loopCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { m.Supervise(loopCtx, 5*time.Second); close(done) }()
	defer func() { stop(); <-done }()
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	crash(t, d.PID)
	if n := launches(t, d.Dirs); n != 1 {
		t.Fatalf("restarted before the tick: %d launches", n)
	}
	clk.Step(5 * time.Second)
	deadline := time.Now().Add(20 * time.Second)
	for events.last("claim").Type != mps.EventRestarted {
		if time.Now().After(deadline) {
			t.Fatalf("no restart after the tick; events %v", events.types("claim"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	wantLimits(t, record(t, d.Dirs), d.Spec)
}

func TestFailedRestartBacksOff(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	root := newRoot(t)
	failFile := filepath.Join(root, "fail")
	clk := testingclock.NewFakeClock(time.Unix(1_800_000_000, 0))
	events := &eventLog{}
	m := newManager(t, root, events,
		mps.WithClock(clk),
		mps.WithRestartBackoff(10*time.Second, time.Minute),
		mps.WithDaemonEnv(mpsfake.EnvFailStartIf+"="+failFile),
		mps.WithTimeouts(500*time.Millisecond, testStopTimeout, 10*time.Second))
	d, err := m.Start(ctx, mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(failFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	crash(t, d.PID)

	err = m.SuperviseOnce(ctx)
	if err == nil || !strings.Contains(err.Error(), "claim") || !strings.Contains(err.Error(), "device init error (test)") {
		t.Fatalf("failed restart: %v; want an error naming the daemon and quoting its log", err)
	}
	if e := events.last("claim"); e.Type != mps.EventRestartFailed || e.Err == nil {
		t.Errorf("last event %+v, want RestartFailed with an error", e)
	}
	steps := []struct {
		step     time.Duration
		launches int
	}{
		{0, 2},                // within the first backoff: no attempt
		{10 * time.Second, 3}, // first backoff over: attempt, fails again
		{10 * time.Second, 3}, // second backoff is 20s
		{10 * time.Second, 4},
	}
	for i, s := range steps {
		clk.Step(s.step)
		_ = m.SuperviseOnce(ctx)
		if n := launches(t, d.Dirs); n != s.launches {
			t.Fatalf("step %d (+%v): %d launches, want %d", i, s.step, n, s.launches)
		}
	}
	if err := os.Remove(failFile); err != nil {
		t.Fatal(err)
	}
	clk.Step(time.Minute)
	if err := m.SuperviseOnce(ctx); err != nil {
		t.Fatalf("restart once the cause is gone: %v", err)
	}
	if e := events.last("claim"); e.Type != mps.EventRestarted || !alive(e.PID) {
		t.Errorf("last event %+v, want Restarted with a live daemon", e)
	}
}

func TestStartAfterACrashNobodyWatched(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	root := newRoot(t)
	spec := mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}, PinnedMemoryLimits: map[string]int64{gpu0: 8 << 30}}
	d, err := newManager(t, root, nil).Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	crash(t, d.PID) // while no plugin runs

	events := &eventLog{}
	again, err := newManager(t, root, events).Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if again.PID == d.PID || again.Restarts != 1 || events.last("claim").Type != mps.EventRestarted {
		t.Errorf("pid %d (was %d), restarts %d, events %v; want a restart", again.PID, d.PID, again.Restarts, events.types("claim"))
	}
	wantLimits(t, record(t, d.Dirs), spec)
}
