package mps

import (
	"os"
	"strings"
	"time"

	"k8s.io/utils/clock"
)

// DefaultControlBinary is the control binary looked up in PATH when
// [WithControlBinary] is not given.
const DefaultControlBinary = "nvidia-cuda-mps-control"

// DefaultBootIDPath is where Linux publishes the ID of the current boot.
const DefaultBootIDPath = "/proc/sys/kernel/random/boot_id"

type options struct {
	binary         string
	clock          clock.WithTicker
	launcher       Launcher
	daemonEnv      []string
	clientEnv      []string
	startTimeout   time.Duration
	stopTimeout    time.Duration
	commandTimeout time.Duration
	pollInterval   time.Duration
	backoffInitial time.Duration
	backoffMax     time.Duration
	onEvent        func(Event)
	procRoot       string
	bootIDPath     string
}

func defaultOptions() options {
	var clientEnv []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CUDA_") {
			clientEnv = append(clientEnv, kv)
		}
	}
	return options{
		clock:          clock.RealClock{},
		launcher:       ProcessLauncher{},
		clientEnv:      clientEnv,
		startTimeout:   10 * time.Second,
		stopTimeout:    10 * time.Second,
		commandTimeout: 10 * time.Second,
		pollInterval:   20 * time.Millisecond,
		backoffInitial: time.Second,
		backoffMax:     2 * time.Minute,
		procRoot:       "/proc",
		bootIDPath:     DefaultBootIDPath,
	}
}

// Option configures [New].
type Option func(*options)

// WithControlBinary sets the absolute path of nvidia-cuda-mps-control;
// without it, [DefaultControlBinary] is looked up in PATH. The same binary
// starts daemons (-d) and sends them commands (as a client).
func WithControlBinary(path string) Option { return func(o *options) { o.binary = path } }

// WithClock sets the clock that drives supervision and restart backoff;
// the real clock by default. Waits on processes (start, stop, commands)
// are bounded by contexts and real time.
func WithClock(c clock.WithTicker) Option { return func(o *options) { o.clock = c } }

// WithLauncher sets how daemons are started; a [ProcessLauncher] without
// wrapping by default.
func WithLauncher(l Launcher) Option { return func(o *options) { o.launcher = l } }

// WithDaemonEnv adds variables to every daemon's environment, e.g.
// LD_LIBRARY_PATH for a driver root that is not /. Variables that the
// Manager sets itself (pipe and log directories, visible devices) win.
func WithDaemonEnv(env ...string) Option {
	return func(o *options) { o.daemonEnv = append(o.daemonEnv, env...) }
}

// WithClientEnv sets the environment client invocations of the control
// binary run with (the pipe and log directories are added); this process's
// environment without CUDA_ variables by default.
func WithClientEnv(env ...string) Option { return func(o *options) { o.clientEnv = env } }

// WithTimeouts sets how long a daemon may take to come up (start), to exit
// after quit before it is killed (stop), and how long one client command
// may take. Defaults: 10s each.
func WithTimeouts(start, stop, command time.Duration) Option {
	return func(o *options) { o.startTimeout, o.stopTimeout, o.commandTimeout = start, stop, command }
}

// WithPollInterval sets how often a pid file or a process is looked at
// while waiting for a daemon to come up or go away; 20ms by default.
func WithPollInterval(d time.Duration) Option { return func(o *options) { o.pollInterval = d } }

// WithRestartBackoff sets the wait after a failed restart of a crashed
// daemon, doubling from initial up to max; 1s and 2m by default.
func WithRestartBackoff(initial, max time.Duration) Option {
	return func(o *options) { o.backoffInitial, o.backoffMax = initial, max }
}

// WithEventHandler has f called for every daemon started, adopted,
// restarted, stopped or killed, and every failed restart, e.g. to record
// Kubernetes events or metrics. f runs on the caller's goroutine, with the
// daemon's lock held: it must return quickly and must not call the Manager.
func WithEventHandler(f func(Event)) Option { return func(o *options) { o.onEvent = f } }

// WithBootIDPath reads the boot ID from path instead of
// [DefaultBootIDPath]. Recorded process start times are only trusted
// within the boot that recorded them.
func WithBootIDPath(path string) Option { return func(o *options) { o.bootIDPath = path } }

// EventType says what happened to a daemon.
type EventType string

// Event types.
const (
	EventStarted       EventType = "Started"
	EventAdopted       EventType = "Adopted"
	EventRestarted     EventType = "Restarted"
	EventRestartFailed EventType = "RestartFailed"
	EventStopped       EventType = "Stopped"
	EventKilled        EventType = "Killed"
)

// Event is one thing that happened to a daemon.
type Event struct {
	ID   string
	Type EventType
	// PID is the daemon's process, where there is one.
	PID int
	// Err says why, for RestartFailed and Killed.
	Err error
}
