package imex

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/proctable"
)

// ReadyAnswer is what nvidia-imex-ctl -q prints for a ready daemon.
const ReadyAnswer = "READY"

// Defaults of [Options].
const (
	DefaultCheckInterval = time.Second
	DefaultMinBackoff    = time.Second
	DefaultMaxBackoff    = 30 * time.Second
	DefaultIdleStop      = 30 * time.Second
	// readyCheckEvery is how many intervals pass between readiness checks
	// of a daemon that was ready: each check runs nvidia-imex-ctl, while
	// the liveness check in between only reads /proc.
	readyCheckEvery = 10
	ctlTimeout      = 5 * time.Second
	stopTimeout     = 5 * time.Second
)

// Options configure a [Supervisor].
type Options struct {
	// Config is what the daemon runs with.
	Config Config
	// Binary is nvidia-imex's path; Ctl is nvidia-imex-ctl's.
	Binary, Ctl string
	// Launcher starts the daemon; nil is [ProcessLauncher].
	Launcher Launcher
	// Env is added to the daemon's environment (the plugin's own, for
	// the process launcher).
	Env []string
	// ProcRoot is /proc's path; "" is /proc.
	ProcRoot string
	// CheckInterval is how often the daemon is looked at; 0 is
	// DefaultCheckInterval.
	CheckInterval time.Duration
	// MinBackoff and MaxBackoff bound the wait before starting a daemon
	// again after a failed start or a crash; 0 is the default.
	MinBackoff, MaxBackoff time.Duration
	// IdleStop is how long the daemon runs on once no claim holds it, so
	// that the next pod of a domain does not wait for a fresh start; 0 is
	// DefaultIdleStop.
	IdleStop time.Duration
	// OnReady, if set, is called (not under any lock of the Supervisor)
	// each time the daemon's readiness changes.
	OnReady func(ready bool)
}

// Supervisor runs the node's one IMEX daemon while claims hold it.
type Supervisor struct {
	o     Options
	table proctable.Table
	wake  chan struct{}

	mu        sync.Mutex
	holders   map[string]bool
	idleSince time.Time
	ref       *proctable.Ref
	ready     bool
	readyCh   chan struct{} // closed while ready
	lastCheck string        // what the last nvidia-imex-ctl -q printed
	lastErr   string        // why the last start failed
	nextStart time.Time
	backoff   time.Duration
	sinceChk  int
	starts    int
	scanned   bool // only touched by Run's goroutine
}

// New returns a supervisor; it writes nothing and starts nothing until
// [Supervisor.Run].
func New(o Options) (*Supervisor, error) {
	if err := o.Config.Validate(); err != nil {
		return nil, err
	}
	if o.Binary == "" || o.Ctl == "" {
		return nil, errors.New("the IMEX daemon and its query tool need paths")
	}
	if o.Launcher == nil {
		o.Launcher = ProcessLauncher{}
	}
	if o.CheckInterval <= 0 {
		o.CheckInterval = DefaultCheckInterval
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(DefaultMaxBackoff, o.MinBackoff)
	}
	if o.IdleStop <= 0 {
		o.IdleStop = DefaultIdleStop
	}
	return &Supervisor{
		o:       o,
		table:   proctable.Table{Root: o.ProcRoot},
		wake:    make(chan struct{}, 1),
		holders: map[string]bool{},
		// A daemon taken over at start with no claim restored stops
		// IdleStop after the start, like one whose last claim went.
		idleSince: time.Now(),
		readyCh:   make(chan struct{}),
		backoff:   o.MinBackoff,
	}, nil
}

// Available reports whether the daemon's program exists: a node without
// nvidia-imex serves channels only.
func Available(binary string) error {
	path, err := exec.LookPath(binary)
	if err != nil {
		return fmt.Errorf("%s: %w", binary, err)
	}
	if _, err := os.Stat(path); err != nil {
		return err
	}
	return nil
}

// Hold records that id (a claim) uses the daemon; the first holder has it
// started. It returns at once; [Supervisor.WaitReady] waits.
func (s *Supervisor) Hold(id string) {
	s.mu.Lock()
	s.holders[id] = true
	s.mu.Unlock()
	s.poke()
}

// Release drops id; once no claim holds the daemon for IdleStop, it stops.
func (s *Supervisor) Release(id string) {
	s.mu.Lock()
	delete(s.holders, id)
	if len(s.holders) == 0 {
		s.idleSince = time.Now()
	}
	s.mu.Unlock()
	s.poke()
}

// Holders returns how many claims hold the daemon.
func (s *Supervisor) Holders() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.holders)
}

// Signal sends sig to the daemon, if one runs: SIGUSR1 makes nvidia-imex
// resolve its peers' names again.
func (s *Supervisor) Signal(sig syscall.Signal) error {
	s.mu.Lock()
	ref := s.ref
	s.mu.Unlock()
	if ref == nil {
		return nil
	}
	return s.table.Kill(*ref, sig)
}

func (s *Supervisor) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Run writes the config files and supervises the daemon until ctx ends.
// It leaves a running daemon running: the next plugin takes it over.
func (s *Supervisor) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("imexConfig", s.o.Config.Path())
	changed, err := s.writeConfig()
	if err != nil {
		return err
	}
	if changed {
		// The daemon reads its config only at start: one started with
		// another config must go.
		for _, ref := range s.daemons() {
			logger.Info("Stopping an IMEX daemon started with another config", "pid", ref.PID)
			s.stop(ctx, ref)
		}
	}
	tick := time.NewTicker(s.o.CheckInterval)
	defer tick.Stop()
	for {
		s.step(klog.NewContext(ctx, logger))
		select {
		case <-ctx.Done():
			return nil
		case <-s.wake:
		case <-tick.C:
		}
	}
}

// writeConfig writes the config and the peer list if they differ from
// what is on disk, and reports whether they did.
func (s *Supervisor) writeConfig() (bool, error) {
	c := s.o.Config
	if err := os.MkdirAll(c.Dir, 0o755); err != nil {
		return false, fmt.Errorf("IMEX directory: %w", err)
	}
	changed := false
	for path, data := range map[string][]byte{c.Path(): c.Render(), c.NodesPath(): c.NodesConfig()} {
		if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
			continue
		}
		if err := writeAtomic(path, data); err != nil {
			return false, fmt.Errorf("write IMEX config %s: %w", path, err)
		}
		changed = true
	}
	return changed, nil
}

// daemons finds the daemons of this config in /proc.
func (s *Supervisor) daemons() []proctable.Ref {
	return s.table.Find(filepath.Base(s.o.Binary), "-c", s.o.Config.Path())
}

// step looks at the daemon once: notices it died, takes one over, starts
// or stops it, and checks its readiness.
func (s *Supervisor) step(ctx context.Context) {
	logger := klog.FromContext(ctx)
	s.mu.Lock()
	held := len(s.holders) > 0
	idle := !held && time.Since(s.idleSince) >= s.o.IdleStop
	ref := s.ref
	s.mu.Unlock()

	if ref != nil && !s.table.Same(*ref) {
		logger.Info("IMEX daemon exited", "pid", ref.PID, "log", s.o.Config.LogPath())
		ref = nil
		s.setRef(nil)
		s.setReady(false, "")
	}
	// /proc is scanned for a daemon to take over at the first step and
	// while claims hold one, not every second on a node that has none.
	if ref == nil && (held || !s.scanned) {
		s.scanned = true
		if found := s.daemons(); len(found) > 0 {
			r := found[0]
			ref = &r
			logger.Info("Took over the running IMEX daemon", "pid", r.PID)
			s.setRef(ref)
			for _, extra := range found[1:] {
				logger.Info("Stopping a second IMEX daemon of this config", "pid", extra.PID)
				s.stop(ctx, extra)
			}
		}
	}
	if !held {
		if ref != nil && idle {
			logger.Info("No claim holds the IMEX daemon: stopping it", "pid", ref.PID)
			s.stop(ctx, *ref)
			s.setRef(nil)
			s.setReady(false, "")
		}
		return
	}
	if ref == nil {
		s.start(ctx)
		return
	}
	s.mu.Lock()
	s.sinceChk++
	due := !s.ready || s.sinceChk >= readyCheckEvery
	s.mu.Unlock()
	if due {
		s.check(ctx)
	}
}

// start launches the daemon unless the backoff says to wait. The daemon
// forks; the next step finds it in /proc.
func (s *Supervisor) start(ctx context.Context) {
	logger := klog.FromContext(ctx)
	s.mu.Lock()
	if time.Now().Before(s.nextStart) {
		s.mu.Unlock()
		return
	}
	wait := s.backoff
	s.nextStart = time.Now().Add(wait)
	s.backoff = min(2*s.backoff, s.o.MaxBackoff)
	s.starts++
	s.mu.Unlock()

	argv := []string{s.o.Binary, "-c", s.o.Config.Path()}
	env := proctable.MergeEnv(os.Environ(), s.o.Env)
	out := filepath.Join(s.o.Config.Dir, LaunchOutName)
	logger.Info("Starting the IMEX daemon", "command", strings.Join(argv, " "), "nextStartIn", wait)
	err := s.o.Launcher.Launch(ctx, argv, env, out)
	s.mu.Lock()
	if err != nil {
		s.lastErr = err.Error()
	} else {
		s.lastErr = ""
	}
	s.mu.Unlock()
	if err != nil {
		logger.Error(err, "Starting the IMEX daemon failed", "retryIn", wait)
		return
	}
	// Give the forked daemon a moment to appear, so that WaitReady's
	// first look finds it.
	for range 20 {
		if found := s.daemons(); len(found) > 0 {
			s.setRef(&found[0])
			s.check(ctx)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *Supervisor) setRef(ref *proctable.Ref) {
	s.mu.Lock()
	s.ref = ref
	s.mu.Unlock()
}

// stop ends a daemon: SIGTERM, then SIGKILL if it is still there after a
// while.
func (s *Supervisor) stop(ctx context.Context, ref proctable.Ref) {
	_ = s.table.Kill(ref, syscall.SIGTERM)
	deadline := time.Now().Add(stopTimeout)
	for s.table.Same(ref) && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	_ = s.table.Kill(ref, syscall.SIGKILL)
	// A killed daemon holds its ports until its last thread is gone.
	for (s.table.Same(ref) || s.table.Exiting(ref)) && time.Now().Before(deadline.Add(stopTimeout)) {
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop ends the daemon now, whoever holds it: for a plugin being removed
// from the node and for tests.
func (s *Supervisor) Stop(ctx context.Context) {
	for _, ref := range s.daemons() {
		s.stop(ctx, ref)
	}
	s.setRef(nil)
	s.setReady(false, "")
}

func writeAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
