package mps_test

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/gpudra/gpudra/internal/mpsfake"
	"github.com/gpudra/gpudra/pkg/mps"
)

func TestStop(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		daemonEnv  []string
		crashFirst bool
		wantEvents []mps.EventType
	}{
		{name: "graceful", wantEvents: []mps.EventType{mps.EventStarted, mps.EventStopped}},
		{name: "forced: quit is ignored", daemonEnv: []string{mpsfake.EnvIgnoreQuit + "=1"},
			wantEvents: []mps.EventType{mps.EventStarted, mps.EventKilled, mps.EventStopped}},
		{name: "daemon already crashed", crashFirst: true, wantEvents: []mps.EventType{mps.EventStarted, mps.EventStopped}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			events := &eventLog{}
			m := newManager(t, newRoot(t), events, mps.WithDaemonEnv(tc.daemonEnv...))
			d, err := m.Start(ctx, mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}, ActiveThreadPercentage: intp(50)})
			if err != nil {
				t.Fatal(err)
			}
			client(t, d.Dirs, "start_server -uid 1000")
			server := record(t, d.Dirs).Servers[0].PID
			if tc.crashFirst {
				crash(t, d.PID)
			}

			start := time.Now()
			if err := m.Stop(ctx, "claim"); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			took := time.Since(start)
			if alive(d.PID) || alive(server) {
				t.Errorf("after Stop: daemon alive %v, server alive %v", alive(d.PID), alive(server))
			}
			if _, err := os.Stat(d.Dirs.Root); !os.IsNotExist(err) {
				t.Errorf("directory %s left behind: %v", d.Dirs.Root, err)
			}
			if got := events.types("claim"); !slices.Equal(got, tc.wantEvents) {
				t.Errorf("events = %v, want %v", got, tc.wantEvents)
			}
			if forced := slices.Contains(tc.wantEvents, mps.EventKilled); forced && took < testStopTimeout {
				t.Errorf("forced Stop took %v, less than the stop timeout %v", took, testStopTimeout)
			}
			if len(m.Supervised()) != 0 {
				t.Errorf("still supervised after Stop: %v", m.Supervised())
			}
			// Idempotent, and the supervisor does not bring it back.
			if err := m.Stop(ctx, "claim"); err != nil {
				t.Errorf("second Stop: %v", err)
			}
			if err := m.SuperviseOnce(ctx); err != nil {
				t.Error(err)
			}
			if _, err := os.Stat(d.Dirs.Root); !os.IsNotExist(err) {
				t.Errorf("supervisor recreated %s", d.Dirs.Root)
			}
		})
	}
}

func TestStopOfUnknownClaimIsNotAnError(t *testing.T) {
	t.Parallel()
	if err := newManager(t, newRoot(t), nil).Stop(testContext(t), "never-started"); err != nil {
		t.Errorf("Stop: %v", err)
	}
}
