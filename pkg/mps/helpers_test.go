package mps_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/internal/mpsfake"
	"github.com/gpudra/gpudra/internal/shorttemp"
	"github.com/gpudra/gpudra/pkg/mps"
)

const (
	gpu0 = "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
	gpu1 = "GPU-11112222-3333-4444-5555-666677778888"
	mig0 = "MIG-5c7f0a2e-9d41-5b8e-a0c3-2f6e1d9b8a70"

	testStopTimeout = 1500 * time.Millisecond
)

func intp(n int) *int { return &n }

// eventLog collects a Manager's events.
type eventLog struct {
	mu     sync.Mutex
	events []mps.Event
}

func (l *eventLog) add(e mps.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// types returns the types of id's events, oldest first.
func (l *eventLog) types(id string) []mps.EventType {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []mps.EventType
	for _, e := range l.events {
		if e.ID == id {
			out = append(out, e.Type)
		}
	}
	return out
}

func (l *eventLog) last(id string) mps.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := len(l.events) - 1; i >= 0; i-- {
		if l.events[i].ID == id {
			return l.events[i]
		}
	}
	return mps.Event{}
}

// newRoot returns a root directory short enough for the daemons' pipes
// (package shorttemp). At the end, the fake processes of the daemons
// under it are killed (like real ones, they outlive their directories),
// then it is removed.
func newRoot(t *testing.T) string {
	t.Helper()
	dir := shorttemp.Dir(t)
	t.Cleanup(func() {
		if err := mpsfake.Kill(fakesUnder(dir)); err != nil {
			t.Error(err)
		}
	})
	return dir
}

// fakesUnder returns the live fake processes (daemons, clients, servers)
// whose pipe directory is under root.
func fakesUnder(root string) []mpsfake.Proc {
	var out []mpsfake.Proc
	for _, p := range mpsfake.Procs(fakeBin) {
		if strings.HasPrefix(p.PipeDir, root+string(filepath.Separator)) {
			out = append(out, p)
		}
	}
	return out
}

// daemonsOf returns the PIDs of the fake control daemons of dirs that run
// now, found in /proc by their pipe directory, not through their pid file.
func daemonsOf(dirs mps.Dirs) []int {
	var pids []int
	for _, p := range mpsfake.Procs(fakeBin) {
		if p.IsDaemon() && p.PipeDir == dirs.Pipe {
			pids = append(pids, p.PID)
		}
	}
	return pids
}

func testContext(t *testing.T) context.Context {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// newManager returns a Manager on root that runs the fake control binary.
func newManager(t *testing.T, root string, events *eventLog, extra ...mps.Option) *mps.Manager {
	t.Helper()
	opts := []mps.Option{
		mps.WithControlBinary(filepath.Join(fakeBin, mpsfake.ControlName)),
		mps.WithTimeouts(10*time.Second, testStopTimeout, 10*time.Second),
		mps.WithPollInterval(5 * time.Millisecond),
	}
	if events != nil {
		opts = append(opts, mps.WithEventHandler(events.add))
	}
	m, err := mps.New(root, append(opts, extra...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m
}

// record returns what the fake daemon of dirs was told.
func record(t *testing.T, dirs mps.Dirs) mpsfake.Record {
	t.Helper()
	r, err := mpsfake.ReadRecord(dirs.Log)
	if err != nil {
		t.Fatalf("fake record: %v", err)
	}
	return r
}

// launches counts the -d invocations for dirs.
func launches(t *testing.T, dirs mps.Dirs) int {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dirs.Log, mpsfake.LaunchesName))
	if os.IsNotExist(err) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(data), "\n")
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool { return mpsfake.Alive(pid) }

func waitDead(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d still alive", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// crash kills pid as a crash would.
func crash(t *testing.T, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d: %v", pid, err)
	}
	waitDead(t, pid)
}

// client sends one command to the daemon of dirs, as a person would.
func client(t *testing.T, dirs mps.Dirs, command string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(fakeBin, mpsfake.ControlName))
	cmd.Env = append(os.Environ(), mps.EnvPipeDirectory+"="+dirs.Pipe, mps.EnvLogDirectory+"="+dirs.Log)
	cmd.Stdin = strings.NewReader(command + "\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%q: %v: %s", command, err, out)
	}
	return strings.TrimSpace(string(out))
}

// sleeper starts an unrelated long-running process.
func sleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(filepath.Join(fakeBin, mpsfake.SleeperName))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// deadPID returns the PID of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command(filepath.Join(fakeBin, mpsfake.SleeperName))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	return cmd.Process.Pid
}

func writePIDFile(t *testing.T, dirs mps.Dirs, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dirs.Pipe, mps.PIDFileName), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// forgetDaemon removes the daemon's process from gpudra's record, as when
// a plugin died between starting the daemon and recording it.
func forgetDaemon(t *testing.T, dirs mps.Dirs) {
	t.Helper()
	path := filepath.Join(dirs.Root, "daemon.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(data, &rec); err != nil {
		t.Fatal(err)
	}
	delete(rec, "daemon")
	delete(rec, "bootID")
	data, _ = json.Marshal(rec)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

// wantLimits checks that the fake daemon holds spec's limits as defaults.
func wantLimits(t *testing.T, r mpsfake.Record, spec mps.Spec) {
	t.Helper()
	if spec.ActiveThreadPercentage == nil {
		if r.ActiveThreadPercentage != nil {
			t.Errorf("active thread percentage = %v, want unset", *r.ActiveThreadPercentage)
		}
	} else if r.ActiveThreadPercentage == nil || *r.ActiveThreadPercentage != float64(*spec.ActiveThreadPercentage) {
		t.Errorf("active thread percentage = %v, want %d", fmtPct(r.ActiveThreadPercentage), *spec.ActiveThreadPercentage)
	}
	want := map[string]int64{}
	for u, b := range spec.PinnedMemoryLimits {
		want[u] = b / mps.MiB
	}
	if len(want) != len(r.PinnedMemLimitMiB) {
		t.Errorf("pinned memory limits (MiB) = %v, want %v", r.PinnedMemLimitMiB, want)
		return
	}
	for u, mib := range want {
		if r.PinnedMemLimitMiB[u] != mib {
			t.Errorf("pinned memory limits (MiB) = %v, want %v", r.PinnedMemLimitMiB, want)
		}
	}
}

func fmtPct(p *float64) string {
	if p == nil {
		return "unset"
	}
	return strconv.FormatFloat(*p, 'f', -1, 64)
}
