package mps_test

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/gpudra/gpudra/internal/mpsfake"
	"github.com/gpudra/gpudra/pkg/mps"
)

func TestNewManagerAdoptsRunningDaemon(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	root := newRoot(t)
	spec := mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0, gpu1}, ActiveThreadPercentage: intp(35),
		PinnedMemoryLimits: map[string]int64{gpu1: 6 << 30}}
	before, err := newManager(t, root, nil).Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	client(t, before.Dirs, "start_server -uid 0")

	// The plugin restarts: a new Manager on the same root.
	events := &eventLog{}
	m := newManager(t, root, events)
	list, err := m.List(ctx)
	if err != nil || len(list) != 1 || !list[0].Running || list[0].PID != before.PID || !list[0].Spec.Equal(spec) {
		t.Fatalf("List after restart: %+v, %v", list, err)
	}
	after, err := m.Adopt(ctx, "claim")
	if err != nil {
		t.Fatalf("Adopt: %v", err)
	}
	if after.PID != before.PID || launches(t, after.Dirs) != 1 {
		t.Errorf("Adopt: pid %d (was %d), %d launches; want the running daemon, no new launch", after.PID, before.PID, launches(t, after.Dirs))
	}
	if again, err := m.Start(ctx, spec); err != nil || again.PID != before.PID {
		t.Errorf("Start after Adopt: pid %d, %v; want the adopted daemon", again.PID, err)
	}
	if got := events.types("claim"); got[0] != mps.EventAdopted || slices.Contains(got, mps.EventStarted) {
		t.Errorf("events = %v, want Adopted and nothing started", got)
	}
	r := record(t, after.Dirs)
	wantLimits(t, r, spec)
	if len(r.Servers) != 1 {
		t.Errorf("adoption disturbed the running server: %+v", r.Servers)
	}
	if got := m.Supervised(); !slices.Equal(got, []string{"claim"}) {
		t.Errorf("supervised = %v, want [claim]", got)
	}

	// The new Manager supervises what it adopted.
	crash(t, after.PID)
	if err := m.SuperviseOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if e := events.last("claim"); e.Type != mps.EventRestarted || e.PID == before.PID {
		t.Errorf("after a crash: last event %+v, want Restarted with a new pid", e)
	}
	wantLimits(t, record(t, after.Dirs), spec)
}

func TestAdoptReappliesLimitsChangedBehindItsBack(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	root := newRoot(t)
	spec := mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}, ActiveThreadPercentage: intp(25),
		PinnedMemoryLimits: map[string]int64{gpu0: 4 << 30}}
	d, err := newManager(t, root, nil).Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	// Someone raises the defaults, and a server starts with them.
	client(t, d.Dirs, "set_default_active_thread_percentage 100")
	client(t, d.Dirs, "set_default_device_pinned_mem_limit "+gpu0+" 80G")
	client(t, d.Dirs, "start_server -uid 1000")

	if _, err := newManager(t, root, nil).Adopt(ctx, "claim"); err != nil {
		t.Fatal(err)
	}
	r := record(t, d.Dirs)
	wantLimits(t, r, spec)
	if len(r.Servers) != 1 {
		t.Fatalf("servers = %+v", r.Servers)
	}
	s := r.Servers[0]
	wantLimits(t, mpsfake.Record{ActiveThreadPercentage: s.ActiveThreadPercentage, PinnedMemLimitMiB: s.PinnedMemLimitMiB}, spec)
}

func TestStalePIDFileIsNotAdopted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// stale rewrites the dead daemon's pid file and record; it returns
		// the PID named, if it is a live process, which must survive.
		stale func(t *testing.T, m *mps.Manager, dirs mps.Dirs) (livePID int)
	}{
		{name: "dead pid", stale: func(t *testing.T, _ *mps.Manager, dirs mps.Dirs) int {
			writePIDFile(t, dirs, strconv.Itoa(deadPID(t))+"\n")
			return 0
		}},
		{name: "pid reused by another program", stale: func(t *testing.T, _ *mps.Manager, dirs mps.Dirs) int {
			pid := sleeper(t).Process.Pid
			writePIDFile(t, dirs, strconv.Itoa(pid)+"\n")
			return pid
		}},
		{name: "pid reused by another claim's daemon", stale: func(t *testing.T, m *mps.Manager, dirs mps.Dirs) int {
			other, err := m.Start(testContext(t), mps.Spec{ID: "other", DeviceUUIDs: []string{gpu1}})
			if err != nil {
				t.Fatal(err)
			}
			writePIDFile(t, dirs, strconv.Itoa(other.PID)+"\n")
			return other.PID
		}},
		{name: "another claim's daemon, and no record of ours", stale: func(t *testing.T, m *mps.Manager, dirs mps.Dirs) int {
			other, err := m.Start(testContext(t), mps.Spec{ID: "other", DeviceUUIDs: []string{gpu1}})
			if err != nil {
				t.Fatal(err)
			}
			writePIDFile(t, dirs, strconv.Itoa(other.PID)+"\n")
			forgetDaemon(t, dirs)
			return other.PID
		}},
		{name: "garbage", stale: func(t *testing.T, _ *mps.Manager, dirs mps.Dirs) int {
			writePIDFile(t, dirs, "not a pid\n")
			return 0
		}},
		{name: "missing", stale: func(t *testing.T, _ *mps.Manager, dirs mps.Dirs) int {
			_ = os.Remove(filepath.Join(dirs.Pipe, mps.PIDFileName))
			return 0
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			root := newRoot(t)
			spec := mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}, ActiveThreadPercentage: intp(45)}
			m := newManager(t, root, nil)
			d, err := m.Start(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			crash(t, d.PID)
			live := tc.stale(t, m, d.Dirs)

			events := &eventLog{}
			m2 := newManager(t, root, events)
			if list, err := m2.List(ctx); err != nil || slices.ContainsFunc(list, func(s mps.Status) bool { return s.Spec.ID == "claim" && s.Running }) {
				t.Errorf("List shows the dead daemon running: %+v, %v", list, err)
			}
			got, err := m2.Adopt(ctx, "claim")
			if err != nil {
				t.Fatalf("Adopt: %v", err)
			}
			if got.PID == live || got.PID == d.PID || !alive(got.PID) || launches(t, d.Dirs) != 2 {
				t.Errorf("Adopt: pid %d (stale %d, dead daemon %d), %d launches; want a new daemon", got.PID, live, d.PID, launches(t, d.Dirs))
			}
			if live != 0 && !alive(live) {
				t.Errorf("the process the stale pid file named (%d) was killed", live)
			}
			if got.Restarts != 1 || events.last("claim").Type != mps.EventRestarted {
				t.Errorf("restarts %d, last event %v; want a restart", got.Restarts, events.last("claim").Type)
			}
			wantLimits(t, record(t, d.Dirs), spec)
		})
	}
}

func TestAdoptWithoutAProcessRecord(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		setup func(t *testing.T, dirs mps.Dirs, bootID string)
	}{
		// The plugin died between starting the daemon and recording it.
		{name: "record has no process", setup: func(t *testing.T, dirs mps.Dirs, _ string) { forgetDaemon(t, dirs) }},
		// Start times mean nothing across boots: the daemon must then be
		// recognized by its pipe directory.
		{name: "record from another boot", setup: func(t *testing.T, _ mps.Dirs, bootID string) {
			if err := os.WriteFile(bootID, []byte("00000000-0000-0000-0000-000000000000\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			root := newRoot(t)
			bootID := filepath.Join(root, "boot_id")
			if err := os.WriteFile(bootID, []byte("3ee9bf4e-2bc3-4adb-a604-5bd7215f0766\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			d, err := newManager(t, root, nil, mps.WithBootIDPath(bootID)).Start(ctx, mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}})
			if err != nil {
				t.Fatal(err)
			}
			tc.setup(t, d.Dirs, bootID)
			got, err := newManager(t, root, nil, mps.WithBootIDPath(bootID)).Adopt(ctx, "claim")
			if err != nil || got.PID != d.PID || launches(t, d.Dirs) != 1 {
				t.Errorf("Adopt: pid %d (running %d), %d launches, %v; want the running daemon", got.PID, d.PID, launches(t, d.Dirs), err)
			}
		})
	}
}

func TestDamagedRecord(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	root := newRoot(t)
	m := newManager(t, root, nil)
	spec := mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}, ActiveThreadPercentage: intp(15)}
	d, err := m.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d.Dirs.Root, "daemon.json"), []byte("{torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The daemon is still recognized by its pipe directory.
	list, err := m.List(ctx)
	if err != nil || len(list) != 1 || list[0].Err == nil || !list[0].Running || list[0].PID != d.PID {
		t.Fatalf("List with a damaged record: %+v, %v; want the error and the running daemon", list, err)
	}
	if _, err := newManager(t, root, nil).Adopt(ctx, "claim"); err == nil || errors.Is(err, mps.ErrNotFound) {
		t.Errorf("Adopt without a readable spec: %v, want an error other than ErrNotFound", err)
	}
	// What cannot be changed on a running daemon is checked against it.
	for _, other := range []mps.Spec{
		{ID: "claim", DeviceUUIDs: []string{gpu1}, ActiveThreadPercentage: intp(15)},
		{ID: "claim", DeviceUUIDs: []string{gpu0}, ActiveThreadPercentage: intp(15), MultiUser: true},
	} {
		if _, err := m.Start(ctx, other); !errors.Is(err, mps.ErrSpecConflict) {
			t.Errorf("Start(%+v) over a damaged record of another daemon: %v, want ErrSpecConflict", other, err)
		}
	}
	// Start knows the spec: it rewrites the record and keeps the daemon.
	again, err := m.Start(ctx, spec)
	if err != nil || again.PID != d.PID || launches(t, d.Dirs) != 1 {
		t.Errorf("Start over a damaged record: pid %d (was %d), %d launches, %v", again.PID, d.PID, launches(t, d.Dirs), err)
	}
	if list, _ := m.List(ctx); len(list) != 1 || list[0].Err != nil {
		t.Errorf("record not rewritten: %+v", list)
	}
	// Stop works from the pid file and the environment alone.
	if err := os.WriteFile(filepath.Join(d.Dirs.Root, "daemon.json"), []byte("{torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.Stop(ctx, "claim"); err != nil || alive(d.PID) {
		t.Errorf("Stop with a damaged record: %v, daemon alive %v", err, alive(d.PID))
	}
}
