package timeslicing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/internal/lockedfile"
)

// Setter applies a time-slice interval to a full GPU.
type Setter interface {
	// Set sets the time slice of the GPU with UUID gpuUUID to interval.
	// Setting the interval a GPU already has is harmless, so the caller
	// retries a failed Set as it is. Set stops when ctx is cancelled.
	Set(ctx context.Context, gpuUUID string, interval v1beta1.TimeSliceInterval) error
}

// DefaultTimeout bounds one nvidia-smi run unless [WithTimeout] says
// otherwise. nvidia-smi initialises every GPU of the node when persistence
// mode is off, which takes seconds on a large node; a run that takes this
// long is stuck.
const DefaultTimeout = 30 * time.Second

// waitDelay is how long a run may keep its output open once nvidia-smi was
// killed, should it have left a child behind that holds it.
const waitDelay = 2 * time.Second

// maxOutput caps the nvidia-smi output an error carries.
const maxOutput = 4096

// NvidiaSMI implements [Setter] by running
// `nvidia-smi compute-policy -i <GPU UUID> --set-timeslice=<0..3>`, where 0
// is Default and 3 is Long ([v1beta1.TimeSliceInterval.Int]). It needs the
// privileges nvidia-smi needs to change a GPU's policy (root on the host).
type NvidiaSMI struct {
	path    string
	timeout time.Duration
	nvml    string
}

var _ Setter = (*NvidiaSMI)(nil)

// Option configures an [NvidiaSMI].
type Option func(*NvidiaSMI)

// WithTimeout bounds each run to d, within the deadline of the caller's
// context; d <= 0 leaves only the caller's deadline.
func WithTimeout(d time.Duration) Option {
	return func(s *NvidiaSMI) { s.timeout = d }
}

// WithNVMLLibrary preloads the NVML library at path (libnvidia-ml.so.1)
// into nvidia-smi through LD_PRELOAD. A plugin container that runs the
// host's nvidia-smi from under the driver root needs it, because the
// container's loader does not search the driver root. Preloading the one
// library, rather than pointing LD_LIBRARY_PATH at the driver root's
// library directory, keeps the host's libc and other libraries away from
// the container's loader.
func WithNVMLLibrary(path string) Option {
	return func(s *NvidiaSMI) { s.nvml = path }
}

// NewNvidiaSMI returns a Setter that runs the nvidia-smi binary at path,
// such as /usr/bin/nvidia-smi on the host, or the same under the driver
// root where the plugin sees the host's driver there.
func NewNvidiaSMI(path string, opts ...Option) *NvidiaSMI {
	s := &NvidiaSMI{path: path, timeout: DefaultTimeout}
	for _, opt := range opts {
		opt(s)
	}
	return s
}

// Set implements [Setter]. Its errors name the command and carry its
// combined output; a run stopped by the timeout or the caller's context
// wraps the context's error.
func (s *NvidiaSMI) Set(ctx context.Context, gpuUUID string, interval v1beta1.TimeSliceInterval) error {
	if err := validateSet(gpuUUID, interval); err != nil {
		return err
	}
	if s.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.timeout)
		defer cancel()
	}
	args := []string{"compute-policy", "-i", gpuUUID, "--set-timeslice=" + strconv.Itoa(interval.Int())}
	cmd := exec.CommandContext(ctx, s.path, args...)
	cmd.Env = withPreload(os.Environ(), s.nvml)
	cmd.WaitDelay = waitDelay
	out, err := cmd.CombinedOutput()
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		err = fmt.Errorf("%w (%w)", ctxErr, err)
	}
	return fmt.Errorf("set time slice of GPU %s to %s: %s %s: %w; %s",
		gpuUUID, interval, s.path, strings.Join(args, " "), err, describeOutput(out))
}

// Memory implements [Setter] by remembering the interval set on each GPU,
// for simulated nodes and tests. The zero value is ready to use and
// safe for concurrent use. It forgets everything with the process, which
// a GPU does not: [LoadMemory] makes one whose intervals live in a file.
type Memory struct {
	mu        sync.Mutex
	intervals map[string]v1beta1.TimeSliceInterval
	calls     []Step
	// path, if set, is the file the intervals are written through to.
	path string
}

// LoadMemory returns a Memory whose intervals live in the file at path, as
// a GPU's time slice outlives the process that set it: the intervals in
// the file, if it exists, are the GPUs' intervals, and every Set replaces
// the file atomically (a temporary file renamed over it) before it
// returns. A Set that cannot write the file fails and changes nothing.
// Several processes may set intervals through one file at once (two
// plugin instances of a rolling update): a Set takes flock(2) on
// <path>.lock and starts from what the file holds; others may read it
// ([ReadIntervals]).
func LoadMemory(path string) (*Memory, error) {
	intervals, err := ReadIntervals(path)
	if err != nil {
		return nil, err
	}
	return &Memory{intervals: intervals, path: path}, nil
}

// ReadIntervals reads a file [LoadMemory] keeps: the interval last set on
// each GPU, by UUID; empty when the file does not exist.
func ReadIntervals(path string) (map[string]v1beta1.TimeSliceInterval, error) {
	intervals := map[string]v1beta1.TimeSliceInterval{}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return intervals, nil
	}
	if err != nil {
		return nil, fmt.Errorf("time slices: %w", err)
	}
	if err := json.Unmarshal(data, &intervals); err != nil {
		return nil, fmt.Errorf("time slices %s: %w", path, err)
	}
	return intervals, nil
}

var _ Setter = (*Memory)(nil)

// Set implements [Setter]; it checks its arguments as [NvidiaSMI.Set]
// does.
func (m *Memory) Set(ctx context.Context, gpuUUID string, interval v1beta1.TimeSliceInterval) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("set time slice of GPU %s to %s: %w", gpuUUID, interval, err)
	}
	if err := validateSet(gpuUUID, interval); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.intervals == nil {
		m.intervals = map[string]v1beta1.TimeSliceInterval{}
	}
	if m.path != "" {
		// Another process may have set other GPUs' intervals since.
		unlock, err := lockedfile.Exclusive(m.path + ".lock")
		if err != nil {
			return fmt.Errorf("set time slice of GPU %s to %s: %w", gpuUUID, interval, err)
		}
		defer unlock()
		m.refreshLocked()
		next := maps.Clone(m.intervals)
		next[gpuUUID] = interval
		if err := writeIntervals(m.path, next); err != nil {
			return fmt.Errorf("set time slice of GPU %s to %s: %w", gpuUUID, interval, err)
		}
	}
	m.intervals[gpuUUID] = interval
	m.calls = append(m.calls, Step{GPU: gpuUUID, Interval: interval, Set: true})
	return nil
}

// Interval returns the interval last set on the GPU, and false when none
// was.
func (m *Memory) Interval(gpuUUID string) (v1beta1.TimeSliceInterval, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refreshLocked()
	iv, ok := m.intervals[gpuUUID]
	return iv, ok
}

// refreshLocked takes in the intervals the file holds, which another
// process may have set; the caller holds m.mu. A file that is missing or
// cannot be read leaves the intervals as they are.
func (m *Memory) refreshLocked() {
	if m.path == "" {
		return
	}
	if _, err := os.Stat(m.path); err != nil {
		return
	}
	if current, err := ReadIntervals(m.path); err == nil {
		m.intervals = current
	}
}

// Calls returns every successful Set so far, in order.
func (m *Memory) Calls() []Step {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Step(nil), m.calls...)
}

// validateSet refuses what no Setter can apply: a time slice is set for a
// full GPU, named by its UUID (an index or bus ID may name another GPU
// after a reboot, and a MIG device has no time slice of its own).
func validateSet(gpuUUID string, interval v1beta1.TimeSliceInterval) error {
	if !strings.HasPrefix(gpuUUID, "GPU-") {
		return fmt.Errorf("set time slice: %q is not a GPU UUID (GPU-...); time slices are set for full GPUs only", gpuUUID)
	}
	if interval.Int() < 0 {
		return fmt.Errorf("set time slice of GPU %s: %w", gpuUUID, field.NotSupported(IntervalField, string(interval), v1beta1.TimeSliceIntervals))
	}
	return nil
}

// withPreload returns env with path put first in LD_PRELOAD, keeping what
// the plugin itself preloads.
func withPreload(env []string, path string) []string {
	if path == "" {
		return env
	}
	out := make([]string, 0, len(env)+1)
	preload := path
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "LD_PRELOAD="); ok {
			if v != "" {
				preload = path + ":" + v
			}
			continue
		}
		out = append(out, kv)
	}
	return append(out, "LD_PRELOAD="+preload)
}

// describeOutput renders a command's output for an error message, on one
// line and capped at maxOutput bytes.
func describeOutput(out []byte) string {
	text := strings.TrimSpace(string(out))
	if text == "" {
		return "no output"
	}
	if len(text) > maxOutput {
		text = text[:maxOutput] + "..."
	}
	return fmt.Sprintf("output: %q", text)
}

// writeIntervals replaces the file at path with intervals, atomically.
func writeIntervals(path string, intervals map[string]v1beta1.TimeSliceInterval) error {
	data, err := json.MarshalIndent(intervals, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // nothing left after a successful rename
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
