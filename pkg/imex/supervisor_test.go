package imex_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/internal/imexfake"
	"github.com/gpudra/gpudra/pkg/imex"
	"github.com/gpudra/gpudra/pkg/proctable"
)

// freePorts returns n TCP ports free on loopback now.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		_ = ln.Close()
	}
	return out
}

// testOptions is a supervisor of the fake daemon in a new directory.
func testOptions(t *testing.T, env ...string) imex.Options {
	t.Helper()
	ports := freePorts(t, 2)
	return imex.Options{
		Config:        imex.Config{Dir: filepath.Join(t.TempDir(), "imex"), NodeIP: "127.0.0.1", ServerPort: ports[0], CmdPort: ports[1], MaxNodes: 4},
		Binary:        filepath.Join(fakeBin, imex.DaemonName),
		Ctl:           filepath.Join(fakeBin, imex.CtlName),
		Env:           env,
		CheckInterval: 200 * time.Millisecond,
		MinBackoff:    200 * time.Millisecond,
		MaxBackoff:    time.Second,
		IdleStop:      time.Hour,
	}
}

// runSupervisor starts s.Run until the test ends (or stop is called) and
// stops the daemon at the end.
func runSupervisor(t *testing.T, o imex.Options) (s *imex.Supervisor, stop func()) {
	t.Helper()
	s, err := imex.New(o)
	if err != nil {
		t.Fatal(err)
	}
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	stop = func() { cancel(); <-done }
	t.Cleanup(func() {
		stop()
		s.Stop(context.Background())
	})
	return s, stop
}

func waitReady(t *testing.T, s *imex.Supervisor, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
}

func liveDaemons(o imex.Options) []proctable.Ref {
	return proctable.Table{}.Find(imex.DaemonName, "-c", o.Config.Path())
}

func TestSupervisorStartsOnHoldAndStopsWhenIdle(t *testing.T) {
	o := testOptions(t)
	o.IdleStop = 300 * time.Millisecond
	var readiness []bool
	ch := make(chan bool, 10)
	o.OnReady = func(r bool) { ch <- r }
	s, _ := runSupervisor(t, o)
	time.Sleep(500 * time.Millisecond)
	if n := len(liveDaemons(o)); n != 0 {
		t.Fatalf("%d daemons run before any claim holds one", n)
	}
	s.Hold("claim-a")
	s.Hold("claim-b")
	waitReady(t, s, 20*time.Second)
	readiness = append(readiness, <-ch)
	if n := len(liveDaemons(o)); n != 1 {
		t.Fatalf("%d daemons run, want 1", n)
	}
	cfg, err := os.ReadFile(o.Config.NodesPath())
	if err != nil || !strings.Contains(string(cfg), "compute-domain-daemon-0003") {
		t.Fatalf("nodes config %q, %v", cfg, err)
	}
	s.Release("claim-a")
	time.Sleep(time.Second)
	if n := len(liveDaemons(o)); n != 1 {
		t.Fatalf("%d daemons run while claim-b holds it, want 1", n)
	}
	s.Release("claim-b")
	deadline := time.Now().Add(15 * time.Second)
	for len(liveDaemons(o)) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the daemon still runs with no claim holding it")
		}
		time.Sleep(100 * time.Millisecond)
	}
	readiness = append(readiness, <-ch)
	if readiness[0] != true || readiness[1] != false {
		t.Errorf("OnReady got %v, want [true false]", readiness)
	}
}

func TestSupervisorTakesOverRunningDaemon(t *testing.T) {
	o := testOptions(t)
	s1, stop1 := runSupervisor(t, o)
	s1.Hold("claim")
	waitReady(t, s1, 20*time.Second)
	pid := s1.Status().PID
	stop1() // the plugin exits; the daemon stays

	if !(proctable.Table{}).IsCommand(pid, imex.DaemonName) {
		t.Fatalf("daemon %d ended with its supervisor", pid)
	}
	s2, _ := runSupervisor(t, o)
	s2.Hold("claim")
	waitReady(t, s2, 20*time.Second)
	st := s2.Status()
	if st.PID != pid || st.Starts != 0 {
		t.Fatalf("new supervisor: pid %d, %d starts; want the old daemon %d taken over with no start", st.PID, st.Starts, pid)
	}
}

func TestSupervisorRestartsKilledDaemon(t *testing.T) {
	o := testOptions(t)
	s, _ := runSupervisor(t, o)
	s.Hold("claim")
	waitReady(t, s, 20*time.Second)
	old := s.Status().PID
	if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := s.Status()
		if st.PID != 0 && st.PID != old && st.Ready {
			if st.Starts != 2 {
				t.Errorf("starts = %d, want 2", st.Starts)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new ready daemon 20s after SIGKILL: %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n := len(liveDaemons(o)); n != 1 {
		t.Errorf("%d daemons run, want 1", n)
	}
}

func TestWaitReadyErrors(t *testing.T) {
	tests := []struct {
		name  string
		setUp func(t *testing.T, o *imex.Options)
		want  []string
	}{
		{
			name: "server port taken",
			setUp: func(t *testing.T, o *imex.Options) {
				ln, err := net.Listen("tcp", net.JoinHostPort(o.Config.NodeIP, strconv.Itoa(o.Config.ServerPort)))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = ln.Close() })
			},
			want: []string{"not ready after", "UNAVAILABLE", imex.LogName, "server port", "address already in use"},
		},
		{
			name: "daemon not ready",
			setUp: func(t *testing.T, o *imex.Options) {
				flag := filepath.Join(t.TempDir(), "not-ready")
				if err := os.WriteFile(flag, nil, 0o644); err != nil {
					t.Fatal(err)
				}
				o.Env = append(o.Env, imexfake.EnvNotReadyIf+"="+flag)
			},
			want: []string{"not ready after", `printed "NOT_READY"`, "nvidia-imex runs as pid", imex.LogName},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := testOptions(t)
			tc.setUp(t, &o)
			s, _ := runSupervisor(t, o)
			s.Hold("claim")
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
			defer cancel()
			err := s.WaitReady(ctx)
			if err == nil {
				t.Fatal("WaitReady succeeded")
			}
			if ctx.Err() != nil {
				t.Errorf("WaitReady returned after its context's deadline; it must answer before")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestHostsChangeReachesDaemonWithoutRestart(t *testing.T) {
	hosts := filepath.Join(t.TempDir(), "hosts")
	o := testOptions(t, imexfake.EnvHostsFile+"="+hosts)
	s, _ := runSupervisor(t, o)
	h := imex.HostsFile{Path: hosts}
	if _, err := h.Write(map[int]string{0: "10.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	s.Hold("claim")
	waitReady(t, s, 20*time.Second)
	pid := s.Status().PID
	changed, err := h.Write(map[int]string{0: "10.0.0.1", 3: "10.0.0.4"})
	if err != nil || !changed {
		t.Fatalf("Write = %v, %v", changed, err)
	}
	if err := s.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		rec, err := imexfake.ReadRecord(o.Config.Dir)
		if err == nil && rec.Reloads == 1 {
			if rec.PID != pid || rec.Peers["compute-domain-daemon-0003"] != "10.0.0.4" || rec.Peers["compute-domain-daemon-0000"] != "10.0.0.1" || len(rec.Peers) != 2 {
				t.Fatalf("record after SIGUSR1: %+v (daemon pid %d)", rec, pid)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon did not resolve its peers again: %+v, %v", rec, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := s.Status(); st.Starts != 1 || st.PID != pid {
		t.Errorf("status %+v: the daemon was restarted", st)
	}
}

func TestFakeKeepsRealFailures(t *testing.T) {
	o := testOptions(t)
	run := func(args ...string) (string, error) {
		out := filepath.Join(t.TempDir(), "out")
		err := proctable.Detached{Argv: append([]string{o.Binary}, args...), Env: os.Environ(), OutPath: out}.Run(context.Background())
		return proctable.Tail(out, 1024), err
	}
	if _, err := run("-c", filepath.Join(t.TempDir(), "missing.cfg")); err == nil || !strings.Contains(err.Error(), "failed to read config file") {
		t.Errorf("no config: %v", err)
	}
	// A daemon whose directory is removed runs on.
	s, _ := runSupervisor(t, o)
	s.Hold("claim")
	waitReady(t, s, 20*time.Second)
	pid := s.Status().PID
	if err := os.RemoveAll(o.Config.Dir); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if !(proctable.Table{}).IsCommand(pid, imex.DaemonName) {
		t.Error("the fake daemon exited when its directory was removed; the real one does not")
	}
}
