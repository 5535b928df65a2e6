package mps_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpudra/gpudra/internal/mpsfake"
	"github.com/gpudra/gpudra/pkg/mps"
)

func TestStartAppliesLimits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		spec mps.Spec
	}{
		{name: "no limits", spec: mps.Spec{ID: "claim-a", DeviceUUIDs: []string{gpu0}}},
		{name: "thread percentage", spec: mps.Spec{ID: "claim-b", DeviceUUIDs: []string{gpu0}, ActiveThreadPercentage: intp(25)}},
		{
			name: "pinned memory per device, rounded down to MiB",
			spec: mps.Spec{ID: "claim-c", DeviceUUIDs: []string{gpu0, gpu1}, PinnedMemoryLimits: map[string]int64{
				gpu0: 10 << 30,         // shown by the daemon as 10G
				gpu1: 1536*mps.MiB + 7, // 1536M, shown as 1G
			}},
		},
		{
			name: "both, on a MIG device, multi-user",
			spec: mps.Spec{ID: "claim-d", DeviceUUIDs: []string{mig0}, ActiveThreadPercentage: intp(50),
				PinnedMemoryLimits: map[string]int64{mig0: 512 * mps.MiB}, MultiUser: true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			root := newRoot(t)
			events := &eventLog{}
			m := newManager(t, root, events)

			d, err := m.Start(ctx, tc.spec)
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			if !alive(d.PID) {
				t.Fatalf("daemon pid %d is not running", d.PID)
			}
			if want := filepath.Join(root, tc.spec.ID, "pipe"); d.Dirs.Pipe != want {
				t.Errorf("pipe dir = %s, want %s", d.Dirs.Pipe, want)
			}
			r := record(t, d.Dirs)
			if r.PID != d.PID {
				t.Errorf("daemon pid = %d, the fake says %d", d.PID, r.PID)
			}
			wantLimits(t, r, tc.spec)
			if !slices.Equal(r.VisibleDevices, tc.spec.DeviceUUIDs) {
				t.Errorf("daemon's CUDA_VISIBLE_DEVICES = %v, want %v", r.VisibleDevices, tc.spec.DeviceUUIDs)
			}
			wantArgs := []string{"-d"}
			if tc.spec.MultiUser {
				wantArgs = append(wantArgs, "-M")
			}
			if !slices.Equal(r.Args, wantArgs) || r.MultiUser != tc.spec.MultiUser {
				t.Errorf("daemon args = %v (multi-user %v), want %v", r.Args, r.MultiUser, wantArgs)
			}
			// A server started for a client now takes the limits.
			client(t, d.Dirs, "start_server -uid 1000")
			r = record(t, d.Dirs)
			if len(r.Servers) != 1 {
				t.Fatalf("servers = %+v, want 1", r.Servers)
			}
			wantLimits(t, mpsfake.Record{ActiveThreadPercentage: r.Servers[0].ActiveThreadPercentage, PinnedMemLimitMiB: r.Servers[0].PinnedMemLimitMiB}, tc.spec)
			if got := events.types(tc.spec.ID); !slices.Equal(got, []mps.EventType{mps.EventStarted}) {
				t.Errorf("events = %v, want [Started]", got)
			}
		})
	}
}

func TestMultiUserLetsUsersShareAServer(t *testing.T) {
	t.Parallel()
	for _, multiUser := range []bool{false, true} {
		t.Run(fmt.Sprintf("multiUser=%v", multiUser), func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			m := newManager(t, newRoot(t), nil)
			d, err := m.Start(ctx, mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}, MultiUser: multiUser})
			if err != nil {
				t.Fatal(err)
			}
			client(t, d.Dirs, "start_server -uid 1000")
			out := client(t, d.Dirs, "start_server -uid 2000")
			if n := len(record(t, d.Dirs).Servers); (n == 2) != multiUser {
				t.Errorf("servers for two users = %d (%q), multi-user %v", n, out, multiUser)
			}
		})
	}
}

func TestContainerEdits(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	root := newRoot(t)
	d, err := newManager(t, root, nil).Start(ctx, mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}})
	if err != nil {
		t.Fatal(err)
	}
	e := d.ContainerEdits()
	wantEnv := []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_LOG_DIRECTORY=/var/log/nvidia-mps"}
	if !slices.Equal(e.Env, wantEnv) {
		t.Errorf("env = %v, want %v", e.Env, wantEnv)
	}
	want := map[string]string{ // container path -> host path
		"/tmp/nvidia-mps":     filepath.Join(root, "claim", "pipe"),
		"/dev/shm":            filepath.Join(root, "claim", "shm"),
		"/var/log/nvidia-mps": filepath.Join(root, "claim", "log"),
	}
	if len(e.Mounts) != len(want) {
		t.Fatalf("mounts = %d, want %d", len(e.Mounts), len(want))
	}
	for _, mnt := range e.Mounts {
		if want[mnt.ContainerPath] != mnt.HostPath {
			t.Errorf("mount %s <- %s, want <- %s", mnt.ContainerPath, mnt.HostPath, want[mnt.ContainerPath])
		}
		st, err := os.Stat(mnt.HostPath)
		if err != nil || !st.IsDir() {
			t.Errorf("mount source %s: %v", mnt.HostPath, err)
		}
		if ro := slices.Contains(mnt.Options, "ro"); ro != (mnt.ContainerPath == "/var/log/nvidia-mps") {
			t.Errorf("mount %s options %v: only the log directory is read-only", mnt.ContainerPath, mnt.Options)
		}
	}
	if st, _ := os.Stat(d.Dirs.Shm); st.Mode()&os.ModeSticky == 0 || st.Mode().Perm() != 0o777 {
		t.Errorf("shm directory mode %v, want sticky and world-writable like /dev/shm", st.Mode())
	}
}

func TestStartIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	m := newManager(t, newRoot(t), nil)
	spec := mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}, ActiveThreadPercentage: intp(30)}
	first, err := m.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	again, err := m.Start(ctx, spec)
	if err != nil {
		t.Fatalf("second Start: %v", err)
	}
	if again.PID != first.PID || launches(t, first.Dirs) != 1 {
		t.Errorf("second Start: pid %d (first %d), %d launches; want the same daemon, 1 launch", again.PID, first.PID, launches(t, first.Dirs))
	}

	other := spec
	other.ActiveThreadPercentage = intp(60)
	_, err = m.Start(ctx, other)
	if !errors.Is(err, mps.ErrSpecConflict) || !strings.Contains(err.Error(), "claim") {
		t.Errorf("Start with another spec: %v, want ErrSpecConflict naming the claim", err)
	}
	if !alive(first.PID) || launches(t, first.Dirs) != 1 {
		t.Error("a refused Start touched the running daemon")
	}
}

func TestConcurrentStartOfOneClaimStartsOneDaemon(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	root := newRoot(t)
	m := newManager(t, root, nil)
	spec := mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}, ActiveThreadPercentage: intp(40)}
	pids := make([]int, 4)
	var wg sync.WaitGroup
	for i := range pids {
		wg.Go(func() {
			d, err := m.Start(ctx, spec)
			if err != nil {
				t.Errorf("Start: %v", err)
			}
			pids[i] = d.PID
		})
	}
	wg.Wait()
	n := launches(t, mps.Dirs{Log: filepath.Join(root, "claim", "log")})
	if n != 1 || slices.ContainsFunc(pids, func(p int) bool { return p != pids[0] }) {
		t.Errorf("pids %v, %d launches; want one daemon", pids, n)
	}
}

func TestConcurrentClaimsGetSeparateDirectories(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	root := newRoot(t)
	m := newManager(t, root, nil)
	const n = 4
	daemons := make([]mps.Daemon, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			d, err := m.Start(ctx, mps.Spec{
				ID:                     fmt.Sprintf("claim-%d", i),
				DeviceUUIDs:            []string{gpu0},
				ActiveThreadPercentage: intp(10 * (i + 1)),
				PinnedMemoryLimits:     map[string]int64{gpu0: int64(i+1) << 30},
			})
			if err != nil {
				t.Errorf("Start claim-%d: %v", i, err)
			}
			daemons[i] = d
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	seenPID, seenDir := map[int]bool{}, map[string]bool{}
	for i, d := range daemons {
		if seenPID[d.PID] || seenDir[d.Dirs.Pipe] || seenDir[d.Dirs.Log] || seenDir[d.Dirs.Shm] {
			t.Errorf("claim-%d shares a daemon or a directory: %+v", i, d)
		}
		seenPID[d.PID] = true
		seenDir[d.Dirs.Pipe], seenDir[d.Dirs.Log], seenDir[d.Dirs.Shm] = true, true, true
		wantLimits(t, record(t, d.Dirs), d.Spec)
	}
	list, err := m.List(ctx)
	if err != nil || len(list) != n {
		t.Fatalf("List: %v, %d daemons, want %d", err, len(list), n)
	}
	for _, s := range list {
		if !s.Running || s.Err != nil {
			t.Errorf("List: %s running=%v err=%v", s.Spec.ID, s.Running, s.Err)
		}
	}
}

func TestStartFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		daemonEnv func(root string) []string
		// startTimeout bounds the wait for the daemon to come up: short
		// where it never does, long where it must come up (under a loaded
		// machine the fake daemon, a copy of the test binary, can take
		// over 500 ms to start) and the refusal comes after.
		startTimeout time.Duration
		want         []string // in the error
	}{
		{
			name: "daemon fails at start",
			daemonEnv: func(root string) []string {
				_ = os.WriteFile(filepath.Join(root, "fail"), nil, 0o644)
				return []string{mpsfake.EnvFailStartIf + "=" + filepath.Join(root, "fail")}
			},
			startTimeout: 500 * time.Millisecond,
			want:         []string{"claim", "nvidia-cuda-mps-control -d", "device init error (test)"},
		},
		{
			name:         "daemon does not take the limits",
			daemonEnv:    func(string) []string { return []string{mpsfake.EnvIgnoreLimits + "=1"} },
			startTimeout: 10 * time.Second,
			want:         []string{"claim", "set_default_active_thread_percentage 40", "did not take", `"100.0"`},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := testContext(t)
			root := newRoot(t)
			m := newManager(t, root, nil, mps.WithDaemonEnv(tc.daemonEnv(root)...),
				mps.WithTimeouts(tc.startTimeout, testStopTimeout, 10*time.Second))
			_, err := m.Start(ctx, mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}, ActiveThreadPercentage: intp(40)})
			if err == nil {
				t.Fatal("Start succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			// Nothing serves clients without its limits.
			dirs := mps.Dirs{Log: filepath.Join(root, "claim", "log")}
			if data, err := os.ReadFile(filepath.Join(dirs.Log, mpsfake.RecordName)); err == nil {
				var r mpsfake.Record
				_ = json.Unmarshal(data, &r)
				waitDead(t, r.PID)
			}
			if len(m.Supervised()) != 0 {
				t.Errorf("a failed Start is supervised: %v", m.Supervised())
			}
		})
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	root := newRoot(t)
	m := newManager(t, root, nil)
	for _, id := range []string{"", ".", "..", "../escape", "a/b", "/abs", "-flag", ".hidden", "with space", "new\nline", strings.Repeat("x", mps.MaxIDLength+1)} {
		t.Run(fmt.Sprintf("id %q", id), func(t *testing.T) {
			_, err := m.Start(ctx, mps.Spec{ID: id, DeviceUUIDs: []string{gpu0}})
			if !errors.Is(err, mps.ErrInvalidSpec) || !strings.Contains(err.Error(), "ID") {
				t.Errorf("Start: %v, want ErrInvalidSpec about the ID", err)
			}
			if _, err := m.Adopt(ctx, id); !errors.Is(err, mps.ErrInvalidSpec) {
				t.Errorf("Adopt: %v, want ErrInvalidSpec", err)
			}
			if err := m.Stop(ctx, id); !errors.Is(err, mps.ErrInvalidSpec) {
				t.Errorf("Stop: %v, want ErrInvalidSpec", err)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(root), "escape")); !os.IsNotExist(err) {
		t.Errorf("something was created outside the root: %v", err)
	}
	entries, _ := os.ReadDir(root)
	if len(entries) != 0 {
		t.Errorf("bad input created %d entries under the root", len(entries))
	}

	specs := []struct {
		spec mps.Spec
		want string
	}{
		{mps.Spec{ID: "c"}, "deviceUUIDs is empty"},
		{mps.Spec{ID: "c", DeviceUUIDs: []string{gpu0, gpu0}}, "appears twice"},
		{mps.Spec{ID: "c", DeviceUUIDs: []string{gpu0 + "\nquit"}}, "deviceUUIDs[0]"},
		{mps.Spec{ID: "c", DeviceUUIDs: []string{"GPU-1 2"}}, "not a device UUID"},
		{mps.Spec{ID: "c", DeviceUUIDs: []string{gpu0}, ActiveThreadPercentage: intp(0)}, "activeThreadPercentage 0: must be 1 to 100"},
		{mps.Spec{ID: "c", DeviceUUIDs: []string{gpu0}, ActiveThreadPercentage: intp(101)}, "activeThreadPercentage 101"},
		{mps.Spec{ID: "c", DeviceUUIDs: []string{gpu0}, PinnedMemoryLimits: map[string]int64{gpu1: 1 << 30}}, "not one of deviceUUIDs"},
		{mps.Spec{ID: "c", DeviceUUIDs: []string{gpu0}, PinnedMemoryLimits: map[string]int64{gpu0: mps.MiB - 1}}, "at least 1 MiB"},
	}
	for _, tc := range specs {
		_, err := m.Start(ctx, tc.spec)
		if !errors.Is(err, mps.ErrInvalidSpec) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Start(%+v): %v, want ErrInvalidSpec with %q", tc.spec, err, tc.want)
		}
	}

	long := strings.Repeat("x", mps.MaxPipeDirLength)
	if _, err := m.Start(ctx, mps.Spec{ID: long, DeviceUUIDs: []string{gpu0}}); !errors.Is(err, mps.ErrInvalidSpec) || !strings.Contains(err.Error(), "unix socket") {
		t.Errorf("Start with a pipe directory too long for sockets: %v", err)
	}

	if _, err := m.Adopt(ctx, "unknown"); !errors.Is(err, mps.ErrNotFound) {
		t.Errorf("Adopt of an unknown daemon: %v, want ErrNotFound", err)
	}
}

func TestMissingBinary(t *testing.T) {
	t.Parallel()
	ctx := testContext(t)
	root := newRoot(t)
	if _, err := mps.New(root, mps.WithControlBinary("/nonexistent/nvidia-cuda-mps-control")); err == nil ||
		!strings.Contains(err.Error(), "/nonexistent/nvidia-cuda-mps-control") {
		t.Errorf("New with a missing binary: %v, want an error naming it", err)
	}
	if _, err := mps.New(root, mps.WithControlBinary("nvidia-cuda-mps-control")); err == nil || !strings.Contains(err.Error(), "absolute") {
		t.Errorf("New with a relative binary: %v", err)
	}
	if _, err := mps.New("relative/root", mps.WithControlBinary(filepath.Join(fakeBin, mpsfake.ControlName))); err == nil {
		t.Error("New with a relative root succeeded")
	}

	// The binary disappears after New (a driver upgrade in progress).
	bin := filepath.Join(root, "bin", mpsfake.ControlName)
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(fakeBin, mpsfake.ControlName), bin); err != nil {
		t.Fatal(err)
	}
	m, err := mps.New(root, mps.WithControlBinary(bin))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	_, err = m.Start(ctx, mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}})
	if err == nil || !strings.Contains(err.Error(), bin) || !strings.Contains(err.Error(), "claim") {
		t.Errorf("Start without the binary: %v, want an error naming the claim and the binary", err)
	}
}

func TestCancelledContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(testContext(t))
	cancel()
	root := newRoot(t)
	m := newManager(t, root, nil)
	if _, err := m.Start(ctx, mps.Spec{ID: "claim", DeviceUUIDs: []string{gpu0}}); !errors.Is(err, context.Canceled) {
		t.Errorf("Start: %v, want context.Canceled", err)
	}
	if n := launches(t, mps.Dirs{Log: filepath.Join(root, "claim", "log")}); n != 0 {
		t.Errorf("%d launches with a cancelled context", n)
	}
}
