package timeslicing_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/timeslicing"
)

// The test binary doubles as a fake nvidia-smi: a script installed where
// the driver root keeps nvidia-smi sets these variables and executes it.
const (
	fakeModeEnv = "GPUDRA_TEST_FAKE_NVIDIA_SMI_MODE"
	fakeLogEnv  = "GPUDRA_TEST_FAKE_NVIDIA_SMI_LOG"
)

// Modes of the fake nvidia-smi.
const (
	// modeOK accepts `compute-policy -i <GPU UUID> --set-timeslice=<0..3>`
	// as nvidia-smi's help documents it and refuses anything else.
	modeOK = "ok"
	// modeFail fails as nvidia-smi does without the privilege to set the
	// policy: a message on stdout and stderr, a non-zero exit.
	modeFail = "fail"
	// modeHang never returns.
	modeHang = "hang"
)

const (
	failStdout = "Unable to set timeslice for GPU 00000000:07:00.0"
	failStderr = "Insufficient Permissions"
	failCode   = 4
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(fakeModeEnv); mode != "" {
		os.Exit(fakeNvidiaSMI(mode, os.Getenv(fakeLogEnv), os.Args[1:]))
	}
	os.Exit(m.Run())
}

// invocation is what the fake records of one run.
type invocation struct {
	Args      []string `json:"args"`
	LDPreload string   `json:"ldPreload"`
	PID       int      `json:"pid"`
}

func fakeNvidiaSMI(mode, logPath string, args []string) int {
	line, _ := json.Marshal(invocation{Args: args, LDPreload: os.Getenv("LD_PRELOAD"), PID: os.Getpid()})
	f, err := os.OpenFile(logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake nvidia-smi:", err)
		return 99
	}
	_, err = f.Write(append(line, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake nvidia-smi:", err)
		return 99
	}
	switch mode {
	case modeOK:
		valid := len(args) == 4 && args[0] == "compute-policy" && args[1] == "-i" && strings.HasPrefix(args[2], "GPU-")
		if valid {
			switch args[3] {
			case "--set-timeslice=0", "--set-timeslice=1", "--set-timeslice=2", "--set-timeslice=3":
			default:
				valid = false
			}
		}
		if !valid {
			fmt.Fprintf(os.Stderr, "fake nvidia-smi: unexpected arguments %q\n", args)
			return 2
		}
		return 0
	case modeFail:
		fmt.Fprintln(os.Stdout, failStdout)
		fmt.Fprintln(os.Stderr, failStderr)
		return failCode
	case modeHang:
		time.Sleep(time.Hour)
		return 0
	}
	fmt.Fprintln(os.Stderr, "fake nvidia-smi: unknown mode", mode)
	return 99
}

// fakeSMI is a fake nvidia-smi installed under a driver root.
type fakeSMI struct {
	path string
	log  string
}

func installFake(t *testing.T, mode string) fakeSMI {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	f := fakeSMI{path: filepath.Join(root, "usr", "bin", "nvidia-smi"), log: filepath.Join(root, "invocations.jsonl")}
	if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
		t.Fatal(err)
	}
	// GORACE: a race-enabled binary otherwise sleeps a second on exit.
	script := fmt.Sprintf("#!/bin/sh\nGORACE=atexit_sleep_ms=0 %s=%s %s=%s exec %s \"$@\"\n",
		fakeModeEnv, shellQuote(mode), fakeLogEnv, shellQuote(f.log), shellQuote(self))
	if err := os.WriteFile(f.path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return f
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// invocations returns what the fake recorded, in order.
func (f fakeSMI) invocations(t *testing.T) []invocation {
	t.Helper()
	invs, err := f.read()
	if err != nil {
		t.Fatal(err)
	}
	return invs
}

// read reads the fake's log; safe outside the test's goroutine.
func (f fakeSMI) read() ([]invocation, error) {
	data, err := os.ReadFile(f.log)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []invocation
	for line := range strings.Lines(string(data)) {
		var inv invocation
		if err := json.Unmarshal([]byte(line), &inv); err != nil {
			return nil, fmt.Errorf("invocation log line %q: %w", line, err)
		}
		out = append(out, inv)
	}
	return out, nil
}

func argsOf(invs []invocation) [][]string {
	var out [][]string
	for _, inv := range invs {
		out = append(out, inv.Args)
	}
	return out
}

func TestNvidiaSMISet(t *testing.T) {
	tests := []struct {
		interval v1beta1.TimeSliceInterval
		flag     string
	}{
		{deflt, "--set-timeslice=0"},
		{short, "--set-timeslice=1"},
		{medium, "--set-timeslice=2"},
		{long, "--set-timeslice=3"},
	}
	for _, tt := range tests {
		t.Run(string(tt.interval), func(t *testing.T) {
			fake := installFake(t, modeOK)
			smi := timeslicing.NewNvidiaSMI(fake.path)
			if err := smi.Set(context.Background(), gpu1, tt.interval); err != nil {
				t.Fatalf("Set: %v", err)
			}
			want := [][]string{{"compute-policy", "-i", gpu1, tt.flag}}
			if got := argsOf(fake.invocations(t)); !reflect.DeepEqual(got, want) {
				t.Errorf("invocations %q, want %q", got, want)
			}
		})
	}
}

func TestNvidiaSMISetEachGPU(t *testing.T) {
	fake := installFake(t, modeOK)
	smi := timeslicing.NewNvidiaSMI(fake.path, timeslicing.WithTimeout(time.Minute))
	for _, s := range []timeslicing.Step{set(gpu1, long), set(gpu2, short), set(gpu1, deflt)} {
		if err := smi.Set(context.Background(), s.GPU, s.Interval); err != nil {
			t.Fatalf("Set(%s, %s): %v", s.GPU, s.Interval, err)
		}
	}
	want := [][]string{
		{"compute-policy", "-i", gpu1, "--set-timeslice=3"},
		{"compute-policy", "-i", gpu2, "--set-timeslice=1"},
		{"compute-policy", "-i", gpu1, "--set-timeslice=0"},
	}
	if got := argsOf(fake.invocations(t)); !reflect.DeepEqual(got, want) {
		t.Errorf("invocations %q, want %q", got, want)
	}
}

func TestNvidiaSMISetNVMLLibrary(t *testing.T) {
	fake := installFake(t, modeOK)
	// The loader only warns about a library it cannot preload, so the file
	// need not be a real library for the fake to see the variable.
	lib := filepath.Join(t.TempDir(), "driver-root", "usr", "lib64", "libnvidia-ml.so.1")
	smi := timeslicing.NewNvidiaSMI(fake.path, timeslicing.WithNVMLLibrary(lib))
	if err := smi.Set(context.Background(), gpu1, medium); err != nil {
		t.Fatalf("Set: %v", err)
	}
	invs := fake.invocations(t)
	if len(invs) != 1 || !strings.HasPrefix(invs[0].LDPreload, lib) {
		t.Errorf("invocations %+v, want one with LD_PRELOAD starting with %s", invs, lib)
	}
}

func TestNvidiaSMISetRefusesArguments(t *testing.T) {
	tests := []struct {
		name     string
		gpu      string
		interval v1beta1.TimeSliceInterval
		wantErr  string
	}{
		{"no UUID", "", short, `set time slice: "" is not a GPU UUID (GPU-...); time slices are set for full GPUs only`},
		{"an index", "0", short, `set time slice: "0" is not a GPU UUID (GPU-...); time slices are set for full GPUs only`},
		{"a MIG device", "MIG-8a2e0f5c-0b1c-5d3e-9f4a-1b2c3d4e5f60", short, `set time slice: "MIG-8a2e0f5c-0b1c-5d3e-9f4a-1b2c3d4e5f60" is not a GPU UUID (GPU-...); time slices are set for full GPUs only`},
		{"an option", "--help", short, `set time slice: "--help" is not a GPU UUID (GPU-...); time slices are set for full GPUs only`},
		{"an unknown interval", gpu1, "Fast", "set time slice of GPU " + gpu1 + `: sharing.timeSlicingConfig.interval: Unsupported value: "Fast": supported values: "Default", "Short", "Medium", "Long"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := installFake(t, modeOK)
			for name, setter := range map[string]timeslicing.Setter{
				"NvidiaSMI": timeslicing.NewNvidiaSMI(fake.path),
				"Memory":    &timeslicing.Memory{},
			} {
				err := setter.Set(context.Background(), tt.gpu, tt.interval)
				if err == nil || err.Error() != tt.wantErr {
					t.Errorf("%s: error:\n got %v\nwant %s", name, err, tt.wantErr)
				}
			}
			if invs := fake.invocations(t); len(invs) != 0 {
				t.Errorf("nvidia-smi ran for refused arguments: %+v", invs)
			}
		})
	}
}

func TestNvidiaSMISetFails(t *testing.T) {
	fake := installFake(t, modeFail)
	err := timeslicing.NewNvidiaSMI(fake.path).Set(context.Background(), gpu1, medium)
	want := "set time slice of GPU " + gpu1 + " to Medium: " + fake.path + " compute-policy -i " + gpu1 +
		` --set-timeslice=2: exit status 4; output: "` + failStdout + `\n` + failStderr + `"`
	if err == nil || err.Error() != want {
		t.Fatalf("error:\n got %v\nwant %s", err, want)
	}
	if n := len(fake.invocations(t)); n != 1 {
		t.Errorf("%d invocations, want 1", n)
	}
}

func TestNvidiaSMISetMissingBinary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usr", "bin", "nvidia-smi")
	err := timeslicing.NewNvidiaSMI(path).Set(context.Background(), gpu1, long)
	want := "set time slice of GPU " + gpu1 + " to Long: " + path + " compute-policy -i " + gpu1 +
		" --set-timeslice=3: fork/exec " + path + ": no such file or directory; no output"
	if err == nil || err.Error() != want || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("error:\n got %v\nwant %s (and errors.Is os.ErrNotExist)", err, want)
	}
}

// TestNvidiaSMISetHangs stops a hanging nvidia-smi by the Setter's own
// timeout and by the caller's context, and checks that the process is
// gone, not merely abandoned.
func TestNvidiaSMISetHangs(t *testing.T) {
	tests := []struct {
		name string
		// run calls Set on a hanging fake; ready is closed once the fake
		// runs.
		run     func(fake fakeSMI, ready <-chan struct{}) error
		wantErr error
	}{
		{
			name: "the Setter's timeout",
			run: func(fake fakeSMI, _ <-chan struct{}) error {
				smi := timeslicing.NewNvidiaSMI(fake.path, timeslicing.WithTimeout(2*time.Second))
				return smi.Set(context.Background(), gpu1, short)
			},
			wantErr: context.DeadlineExceeded,
		},
		{
			name: "the caller cancels",
			run: func(fake fakeSMI, ready <-chan struct{}) error {
				ctx, cancel := context.WithCancel(context.Background())
				go func() {
					<-ready
					cancel()
				}()
				return timeslicing.NewNvidiaSMI(fake.path).Set(ctx, gpu1, short)
			},
			wantErr: context.Canceled,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fake := installFake(t, modeHang)
			ready := make(chan struct{})
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				for invs, err := fake.read(); err != nil || len(invs) == 0; invs, err = fake.read() {
					select {
					case <-stop:
						return
					case <-time.After(10 * time.Millisecond):
					}
				}
				close(ready)
			}()
			err := tt.run(fake, ready)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error %v, want one wrapping %v", err, tt.wantErr)
			}
			for _, part := range []string{fake.path + " compute-policy -i " + gpu1 + " --set-timeslice=1", "signal: killed"} {
				if !strings.Contains(err.Error(), part) {
					t.Errorf("error %q does not contain %q", err, part)
				}
			}
			invs := fake.invocations(t)
			if len(invs) != 1 {
				t.Fatalf("%d invocations, want 1 (the run ended before the fake started?)", len(invs))
			}
			if err := syscall.Kill(invs[0].PID, 0); !errors.Is(err, syscall.ESRCH) {
				t.Errorf("fake nvidia-smi (pid %d) still exists: kill -0: %v", invs[0].PID, err)
			}
		})
	}
}

func TestMemory(t *testing.T) {
	var m timeslicing.Memory
	if iv, ok := m.Interval(gpu1); ok {
		t.Errorf("Interval before any Set = %q, true", iv)
	}
	ctx := context.Background()
	for _, s := range []timeslicing.Step{set(gpu1, long), set(gpu2, short), set(gpu1, deflt)} {
		if err := m.Set(ctx, s.GPU, s.Interval); err != nil {
			t.Fatal(err)
		}
	}
	if iv, ok := m.Interval(gpu1); iv != deflt || !ok {
		t.Errorf("Interval(gpu1) = %q, %v; want Default, true", iv, ok)
	}
	if iv, ok := m.Interval(gpu2); iv != short || !ok {
		t.Errorf("Interval(gpu2) = %q, %v; want Short, true", iv, ok)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := m.Set(cancelled, gpu2, long); !errors.Is(err, context.Canceled) {
		t.Errorf("Set with a cancelled context: %v", err)
	}
	want := []timeslicing.Step{set(gpu1, long), set(gpu2, short), set(gpu1, deflt)}
	if got := m.Calls(); !reflect.DeepEqual(got, want) {
		t.Errorf("Calls() = %+v, want %+v", got, want)
	}
}

func TestLoadMemoryOutlivesTheProcess(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	path := filepath.Join(dir, "timeslices.json")
	m, err := timeslicing.LoadMemory(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Set(ctx, gpu1, long); err != nil {
		t.Fatal(err)
	}
	if err := m.Set(ctx, gpu2, short); err != nil {
		t.Fatal(err)
	}
	// The next process finds the GPUs as the last one left them.
	again, err := timeslicing.LoadMemory(path)
	if err != nil {
		t.Fatal(err)
	}
	if iv, ok := again.Interval(gpu1); iv != long || !ok {
		t.Errorf("after a restart Interval(gpu1) = %q, %v; want Long", iv, ok)
	}
	if got, err := timeslicing.ReadIntervals(path); err != nil || got[gpu2] != short {
		t.Errorf("ReadIntervals = %v, %v; want gpu2 Short", got, err)
	}
	// A Set that cannot be written through fails and changes nothing.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := again.Set(ctx, gpu1, short); err == nil {
		t.Error("Set succeeded without its file")
	}
	if iv, _ := again.Interval(gpu1); iv != long {
		t.Errorf("a failed Set changed the interval to %q", iv)
	}
}

func TestLoadMemoryRefusesAGarbledFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timeslices.json")
	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := timeslicing.LoadMemory(path); err == nil {
		t.Error("LoadMemory accepted a garbled file")
	}
}

// TestPolicyDrivesSetter is the loop the plugin runs: each step the policy
// returns is applied, and the GPU ends as the policy says.
func TestPolicyDrivesSetter(t *testing.T) {
	var m timeslicing.Memory
	p := timeslicing.New()
	ctx := context.Background()
	apply := func(s timeslicing.Step, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if s.Set {
			if err := m.Set(ctx, s.GPU, s.Interval); err != nil {
				t.Fatal(err)
			}
		}
	}
	apply(p.Acquire(gpu1, claim("a"), short))
	apply(p.Acquire(gpu1, claim("b"), short))
	if _, err := p.Acquire(gpu1, claim("c"), long); err == nil {
		t.Fatal("conflicting Acquire succeeded")
	}
	apply(p.Release(gpu1, "a"), nil)
	if iv, _ := m.Interval(gpu1); iv != short {
		t.Errorf("GPU at %q while b holds Short", iv)
	}
	apply(p.Release(gpu1, "b"), nil)
	if iv, _ := m.Interval(gpu1); iv != deflt {
		t.Errorf("GPU at %q after the last release, want Default", iv)
	}
	if want := []timeslicing.Step{set(gpu1, short), set(gpu1, deflt)}; !reflect.DeepEqual(m.Calls(), want) {
		t.Errorf("calls %+v, want %+v", m.Calls(), want)
	}
}

// Two processes set intervals through one file at once (a rolling
// update): neither loses what the other set.
func TestLoadMemorySharedByTwoProcesses(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "timeslices.json")
	a, err := timeslicing.LoadMemory(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := timeslicing.LoadMemory(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Set(ctx, gpu1, long); err != nil {
		t.Fatal(err)
	}
	if err := b.Set(ctx, gpu2, short); err != nil {
		t.Fatal(err)
	}
	if got, err := timeslicing.ReadIntervals(path); err != nil || got[gpu1] != long || got[gpu2] != short {
		t.Errorf("ReadIntervals = %v, %v; want gpu1 Long and gpu2 Short", got, err)
	}
	if iv, _ := a.Interval(gpu2); iv != short {
		t.Errorf("A sees gpu2 at %q after B set Short", iv)
	}
}
