package mps_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/internal/mpsfake"
	"github.com/gpudra/gpudra/pkg/mps"
)

// hookLauncher runs the real launcher, then after.
type hookLauncher struct {
	mps.ProcessLauncher
	after func(req mps.LaunchRequest) error
}

func (l hookLauncher) Launch(ctx context.Context, req mps.LaunchRequest) error {
	if err := l.ProcessLauncher.Launch(ctx, req); err != nil {
		return err
	}
	return l.after(req)
}

// A Start that fails once the daemon has been forked leaves no daemon
// behind: not one still coming up, and not one that comes up late.
func TestFailedStartAfterTheForkLeavesNoDaemon(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// after runs once the daemon has been forked; cancel cancels
		// Start's context.
		after   func(cancel context.CancelFunc) error
		wantErr []string
		wantIs  error
	}{
		{
			name:  "context cancelled right after the fork",
			after: func(cancel context.CancelFunc) error { cancel(); return nil },
			// Where the cancellation is noticed depends on the machine's
			// load: waiting for the daemon, or in the first command
			// once it answered. Either way nothing may stay up.
			wantErr: []string{"claim", "cancelled after", "context canceled"},
			wantIs:  context.Canceled,
		},
		{
			name:    "launcher fails after the fork",
			after:   func(context.CancelFunc) error { return errors.New("launcher lost track (test)") },
			wantErr: []string{"claim", "launcher lost track (test)"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			startCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			l := hookLauncher{after: func(mps.LaunchRequest) error { return tc.after(cancel) }}
			m := newManager(t, newRoot(t), nil, mps.WithLauncher(l))
			dirs := m.Dirs("claim")

			_, err := m.Start(startCtx, mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}, ActiveThreadPercentage: intp(50)})
			if err == nil {
				t.Fatal("Start succeeded")
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("error %q does not wrap %v", err, tc.wantIs)
			}
			if launches(t, dirs) != 1 {
				t.Fatalf("%d launches, want 1: the test did not fork a daemon", launches(t, dirs))
			}
			if pids := daemonsOf(dirs); len(pids) != 0 {
				t.Errorf("daemons of the failed Start still run: %v", pids)
			}
			// Nothing comes up late either.
			time.Sleep(300 * time.Millisecond)
			if pids := daemonsOf(dirs); len(pids) != 0 {
				t.Errorf("daemons of the failed Start run 300ms later: %v", pids)
			}
			if len(m.Supervised()) != 0 {
				t.Errorf("a failed Start is supervised: %v", m.Supervised())
			}
		})
	}
}

// Starts cancelled at random moments, most of them while the daemon is
// being forked or coming up, each followed by Stop (as Unprepare follows a
// failed Prepare): once Stop has returned, no daemon of the ID runs, and a
// Start that was cancelled says so.
func TestCancelledStartThenStopLeavesNoDaemon(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	m := newManager(t, newRoot(t), nil)
	spec := mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}, ActiveThreadPercentage: intp(50)}
	dirs := m.Dirs(spec.ID)

	// Cancels are spread over the time an undisturbed Start takes here.
	began := time.Now()
	if _, err := m.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	window := time.Since(began)
	if err := m.Stop(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}

	const tries = 60
	cancelled := 0
	for i := range tries {
		startCtx, cancel := context.WithCancel(ctx)
		delay := rand.N(2 * window)
		timer := time.AfterFunc(delay, cancel)
		began := time.Now()
		_, err := m.Start(startCtx, spec)
		took := time.Since(began)
		timer.Stop()
		cancel()
		if err != nil {
			cancelled++
			if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "cancelled") {
				t.Errorf("try %d: Start cancelled after %v: %v; want an error saying it was cancelled", i, delay, err)
			}
			if strings.Contains(err.Error(), "not up after") {
				t.Errorf("try %d: Start gave up after %v, cancelled, but says %q", i, took, err)
			}
		}
		if err := m.Stop(ctx, spec.ID); err != nil {
			t.Fatalf("try %d: Stop after a Start cancelled after %v: %v", i, delay, err)
		}
		if pids := daemonsOf(dirs); len(pids) != 0 {
			t.Fatalf("try %d: Start cancelled after %v (%v), then Stop succeeded, and daemons of %s still run: %v", i, delay, err, spec.ID, pids)
		}
	}
	t.Logf("%d of %d Starts cancelled, delays up to %v", cancelled, tries, 2*window)
	if cancelled == 0 {
		t.Errorf("no Start of %d was cancelled: the delays (up to %v) miss the start", tries, 2*window)
	}
}

// Stop finds the daemon of an ID in /proc, by its pipe directory, when its
// pid file does not name it, and only succeeds once it is gone.
func TestStopFindsADaemonItsPIDFileDoesNotName(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// pidFile changes the daemon's pid file; it returns a live
		// process the file names instead, which must survive.
		pidFile func(t *testing.T, dirs mps.Dirs) (livePID int)
	}{
		{name: "deleted", pidFile: func(t *testing.T, dirs mps.Dirs) int {
			if err := os.Remove(filepath.Join(dirs.Pipe, mps.PIDFileName)); err != nil {
				t.Fatal(err)
			}
			return 0
		}},
		{name: "garbage", pidFile: func(t *testing.T, dirs mps.Dirs) int {
			writePIDFile(t, dirs, "not a pid\n")
			return 0
		}},
		{name: "names another program", pidFile: func(t *testing.T, dirs mps.Dirs) int {
			pid := sleeper(t).Process.Pid
			writePIDFile(t, dirs, strconv.Itoa(pid)+"\n")
			return pid
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			events := &eventLog{}
			m := newManager(t, newRoot(t), events)
			d, err := m.Start(ctx, mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}})
			if err != nil {
				t.Fatal(err)
			}
			client(t, d.Dirs, "start_server -uid 1000")
			server := record(t, d.Dirs).Servers[0].PID
			live := tc.pidFile(t, d.Dirs)

			if err := m.Stop(ctx, "claim"); err != nil {
				t.Fatalf("Stop: %v", err)
			}
			if pids := daemonsOf(d.Dirs); len(pids) != 0 || alive(d.PID) || alive(server) {
				t.Errorf("after Stop: daemons %v run (started %d), server alive %v", pids, d.PID, alive(server))
			}
			if live != 0 && !alive(live) {
				t.Errorf("the process the pid file named (%d) was killed", live)
			}
			if _, err := os.Stat(d.Dirs.Root); !os.IsNotExist(err) {
				t.Errorf("directory %s left behind: %v", d.Dirs.Root, err)
			}
			want := []mps.EventType{mps.EventStarted, mps.EventKilled, mps.EventStopped}
			if got := events.types("claim"); !slices.Equal(got, want) {
				t.Errorf("events = %v, want %v", got, want)
			}
		})
	}
}

// Like the real daemon, the fake runs on when its directories are removed;
// Stop still finds and stops it, and then has nothing left to do.
func TestDaemonOutlivesItsDirectory(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	events := &eventLog{}
	m := newManager(t, newRoot(t), events)
	d, err := m.Start(ctx, mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(d.Dirs.Root); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if !alive(d.PID) || !slices.Contains(daemonsOf(d.Dirs), d.PID) {
		t.Fatalf("daemon %d exited when its directory was removed; a real one runs on", d.PID)
	}

	if err := m.Stop(ctx, "claim"); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if pids := daemonsOf(d.Dirs); len(pids) != 0 || alive(d.PID) {
		t.Errorf("after Stop: daemons %v run (started %d)", pids, d.PID)
	}
	if e := events.last("claim"); e.Type != mps.EventStopped {
		t.Errorf("last event %+v, want Stopped", e)
	}
	if err := m.Stop(ctx, "claim"); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if _, err := os.Stat(d.Dirs.Root); !os.IsNotExist(err) {
		t.Errorf("Stop recreated %s: %v", d.Dirs.Root, err)
	}
	if got := fakesUnder(filepath.Dir(d.Dirs.Root)); len(got) != 0 {
		t.Errorf("fake processes left: %+v", got)
	}
}

// A launcher orphaned by a killed plugin forks its daemon whenever it gets
// to run, here while Stop looks through /proc: after Stop has listed the
// processes, so the daemon is not in the list, and the launcher exits
// before Stop reads it (chaos seed 508). Stop must still find the daemon
// and kill it.
func TestStopFindsADaemonForkedWhileItLooks(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	m := newManager(t, newRoot(t), nil)
	dirs := m.Dirs("claim")
	forked := false
	mps.SetAfterProcList(m, func() {
		if forked {
			return
		}
		forked = true
		for _, d := range []string{dirs.Pipe, dirs.Log} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Error(err)
			}
		}
		err := mps.ProcessLauncher{}.Launch(ctx, mps.LaunchRequest{
			ID:   "claim",
			Argv: []string{filepath.Join(fakeBin, mpsfake.ControlName), "-d"},
			Env:  []string{mps.EnvPipeDirectory + "=" + dirs.Pipe, mps.EnvLogDirectory + "=" + dirs.Log, mps.EnvVisibleDevices + "=" + gpu0},
			Dirs: dirs,
		})
		if err != nil {
			t.Error(err)
		}
	})

	if err := m.Stop(ctx, "claim"); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if !forked {
		t.Fatal("Stop never looked through /proc: the test forked no daemon")
	}
	if pids := daemonsOf(dirs); len(pids) != 0 {
		t.Fatalf("a daemon forked while Stop looked still runs: %v", pids)
	}
	if _, err := os.Stat(dirs.Root); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Stop left %s: %v", dirs.Root, err)
	}
}
