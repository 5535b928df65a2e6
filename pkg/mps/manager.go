package mps

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/proctable"
)

var (
	// ErrNotFound is returned by Adopt for an ID that has no daemon
	// directory with a readable record.
	ErrNotFound = errors.New("no MPS daemon with this ID")
	// ErrSpecConflict is returned by Start when a daemon with the ID exists
	// with another spec. Stop it first; retrying does not help.
	ErrSpecConflict = errors.New("an MPS daemon with this ID exists with another spec")
)

// Manager starts, supervises and stops NVIDIA MPS control daemons, one per
// shared claim (or share of a fractional GPU), each with its own pipe, log
// and shm directories under one root directory.
//
// Daemons are not children of the Manager's process: they outlive it, and
// a new Manager on the same root (after a plugin restart or upgrade) finds
// them through their pid files and adopts them. Every method is safe for
// concurrent use; operations on one ID are serialized, on different IDs
// they run in parallel. Two Managers on one root are not coordinated with
// each other; the daemon itself refuses a second instance on one pipe
// directory.
type Manager struct {
	root   string
	opts   options
	proc   procFS
	bootID string

	mu         sync.Mutex
	locks      map[string]*idLock
	supervised map[string]*supervision
}

type idLock struct {
	ch   chan struct{}
	refs int
}

// supervision is what the supervisor keeps about one daemon.
type supervision struct {
	spec        Spec
	failures    int
	nextAttempt time.Time
}

// Daemon is a control daemon and what a claim's containers need of it.
type Daemon struct {
	Spec Spec
	Dirs Dirs
	// PID is the control daemon's process in the Manager's PID namespace;
	// 0 when it is not running.
	PID int
	// Restarts counts the times the daemon died and was started again.
	Restarts int
}

// Status is a daemon found on disk by List.
type Status struct {
	Daemon
	// Running says whether its control daemon runs.
	Running bool
	// Err says why its record could not be read; Spec then only has the
	// ID.
	Err error
}

// Dirs returns the directories of the daemon with the given ID, whether
// or not it runs.
func (m *Manager) Dirs(id string) Dirs { return dirsFor(m.root, id) }

// New returns a Manager that keeps its daemons' directories under root,
// which must be an absolute path; it is created if missing. Every parent of
// root must be searchable by all users: MPS servers run under their
// clients' user IDs and must reach the pipe directory.
func New(root string, opts ...Option) (*Manager, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if !filepath.IsAbs(root) {
		return nil, fmt.Errorf("MPS root directory %q: must be an absolute path", root)
	}
	if o.binary == "" {
		p, err := exec.LookPath(DefaultControlBinary)
		if err != nil {
			return nil, fmt.Errorf("MPS control binary: %w (give its path)", err)
		}
		o.binary = p
	}
	if !filepath.IsAbs(o.binary) {
		return nil, fmt.Errorf("MPS control binary %q: must be an absolute path", o.binary)
	}
	if err := checkExecutable(o.binary); err != nil {
		return nil, fmt.Errorf("MPS control binary: %w", err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("MPS root directory: %w", err)
	}
	return &Manager{
		root:       filepath.Clean(root),
		opts:       o,
		proc:       procFS{Table: proctable.Table{Root: o.procRoot}},
		bootID:     proctable.BootID(o.bootIDPath),
		locks:      map[string]*idLock{},
		supervised: map[string]*supervision{},
	}, nil
}

func checkExecutable(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s: not an executable file (mode %v)", path, st.Mode())
	}
	return nil
}

// Start makes sure the daemon of spec runs with spec's limits and is
// supervised, and returns it. It is idempotent: when the daemon already
// runs with the same spec (started by this Manager or an earlier one), it
// is adopted, its limits applied again, and no second daemon is started. A
// daemon of the same ID with another spec is an error wrapping
// ErrSpecConflict.
//
// When Start launches a daemon and fails, nothing serves clients: a daemon
// that came up but did not take its limits is killed. When the daemon was
// already running, it is left running (containers may be using it) and
// supervised. Errors are recoverable by retrying unless they wrap
// ErrInvalidSpec or ErrSpecConflict.
func (m *Manager) Start(ctx context.Context, spec Spec) (Daemon, error) {
	if err := spec.Validate(); err != nil {
		return Daemon{}, fmt.Errorf("start MPS daemon: %w", err)
	}
	if pipe := dirsFor(m.root, spec.ID).Pipe; len(pipe) > MaxPipeDirLength {
		return Daemon{}, fmt.Errorf("start MPS daemon: %w: pipe directory %s is %d bytes long, at most %d fit unix socket paths; use a shorter root or ID",
			ErrInvalidSpec, pipe, len(pipe), MaxPipeDirLength)
	}
	spec = spec.clone()
	unlock, err := m.lock(ctx, spec.ID)
	if err != nil {
		return Daemon{}, fmt.Errorf("start MPS daemon %s: %w", spec.ID, err)
	}
	defer unlock()
	logger := klog.FromContext(ctx).WithValues("mpsDaemon", spec.ID)

	dirs := dirsFor(m.root, spec.ID)
	st, err := readState(dirs)
	switch {
	case err == nil:
		if !st.Spec.Equal(spec) {
			return Daemon{}, fmt.Errorf("start MPS daemon %s: %w: it has %+v, asked for %+v", spec.ID, ErrSpecConflict, st.Spec, spec)
		}
		if ref, ok := m.find(dirs, st); ok {
			d, err := m.adoptRunning(ctx, spec, dirs, st, ref)
			if err != nil {
				return Daemon{}, fmt.Errorf("start MPS daemon %s: %w", spec.ID, err)
			}
			logger.V(2).Info("MPS control daemon already running", "pid", ref.PID)
			return d, nil
		}
	case errors.Is(err, fs.ErrNotExist):
		st = nil
	default:
		// The record is damaged; the spec being started replaces it. A
		// daemon still serving the pipe directory is kept if it was started
		// the way spec says (the limits are applied again anyway).
		logger.Error(err, "Replacing an unreadable MPS daemon record")
		st = &state{Spec: spec}
		if ref, ok := m.find(dirs, nil); ok {
			if err := m.startedAs(ref, spec); err != nil {
				return Daemon{}, fmt.Errorf("start MPS daemon %s: %w: its record is unreadable and the running daemon (pid %d) %w", spec.ID, ErrSpecConflict, ref.PID, err)
			}
			d, err := m.adoptRunning(ctx, spec, dirs, st, ref)
			if err != nil {
				return Daemon{}, fmt.Errorf("start MPS daemon %s: %w", spec.ID, err)
			}
			return d, nil
		}
		st = nil
	}

	// A record with a process means a daemon ran here and died.
	restart := st != nil && st.Daemon != nil
	d, err := m.launch(ctx, spec, dirs, st, restart)
	if err != nil {
		return Daemon{}, fmt.Errorf("start MPS daemon %s: %w", spec.ID, err)
	}
	m.supervise(spec)
	logger.Info("Started MPS control daemon", "pid", d.PID, "devices", spec.DeviceUUIDs, "multiUser", spec.MultiUser, "restarts", d.Restarts)
	event := EventStarted
	if restart {
		event = EventRestarted
	}
	m.emit(Event{ID: spec.ID, Type: event, PID: d.PID})
	return d, nil
}

// Adopt takes over the daemon of id found on disk, e.g. after a plugin
// restart: when it runs, it is supervised from now on and its limits are
// applied again; when it does not (it died with nobody watching, or its pid
// file names a process that is not it), it is started again from its
// record. Either way no second daemon is started. An ID with no record is
// an error wrapping ErrNotFound.
//
// A daemon that cannot be started again stays supervised, so the
// supervisor keeps trying with backoff; Stop ends that.
func (m *Manager) Adopt(ctx context.Context, id string) (Daemon, error) {
	if err := ValidateID(id); err != nil {
		return Daemon{}, fmt.Errorf("adopt MPS daemon: %w", err)
	}
	unlock, err := m.lock(ctx, id)
	if err != nil {
		return Daemon{}, fmt.Errorf("adopt MPS daemon %s: %w", id, err)
	}
	defer unlock()
	logger := klog.FromContext(ctx).WithValues("mpsDaemon", id)

	dirs := dirsFor(m.root, id)
	st, err := readState(dirs)
	if errors.Is(err, fs.ErrNotExist) {
		return Daemon{}, fmt.Errorf("adopt MPS daemon %s: %w (no %s)", id, ErrNotFound, filepath.Join(dirs.Root, stateFileName))
	}
	if err != nil {
		return Daemon{}, fmt.Errorf("adopt MPS daemon %s: %w", id, err)
	}
	if st.Spec.ID != id {
		return Daemon{}, fmt.Errorf("adopt MPS daemon %s: its record names daemon %q", id, st.Spec.ID)
	}
	if err := st.Spec.Validate(); err != nil {
		return Daemon{}, fmt.Errorf("adopt MPS daemon %s: record: %w", id, err)
	}
	if ref, ok := m.find(dirs, st); ok {
		d, err := m.adoptRunning(ctx, st.Spec, dirs, st, ref)
		if err != nil {
			return Daemon{}, fmt.Errorf("adopt MPS daemon %s: %w", id, err)
		}
		logger.Info("Adopted running MPS control daemon", "pid", ref.PID)
		return d, nil
	}
	m.supervise(st.Spec)
	d, err := m.launch(ctx, st.Spec, dirs, st, true)
	if err != nil {
		m.restartFailed(ctx, id, err)
		return Daemon{}, fmt.Errorf("adopt MPS daemon %s: not running, and starting it again failed: %w", id, err)
	}
	logger.Info("MPS control daemon was not running; started it again", "pid", d.PID, "restarts", d.Restarts)
	m.emit(Event{ID: id, Type: EventRestarted, PID: d.PID})
	return d, nil
}

// adoptRunning supervises ref, the running daemon of dirs, records it and
// applies the limits again. Adopted is reported when this Manager did not
// supervise the daemon yet (not for every retried Start).
func (m *Manager) adoptRunning(ctx context.Context, spec Spec, dirs Dirs, st *state, ref procRef) (Daemon, error) {
	m.mu.Lock()
	_, known := m.supervised[spec.ID]
	m.mu.Unlock()
	m.supervise(spec)
	if st.Daemon == nil || *st.Daemon != ref || st.BootID != m.bootID {
		st.Daemon, st.BootID = &ref, m.bootID
		if err := writeState(dirs, st); err != nil {
			return Daemon{}, fmt.Errorf("record daemon: %w", err)
		}
	}
	if err := m.applyLimits(ctx, spec, dirs); err != nil {
		return Daemon{}, err
	}
	if !known {
		m.emit(Event{ID: spec.ID, Type: EventAdopted, PID: ref.PID})
	}
	return Daemon{Spec: spec.clone(), Dirs: dirs, PID: ref.PID, Restarts: st.Restarts}, nil
}

// List returns every daemon that has a directory under the root, whether
// or not it runs and whether or not this Manager supervises it, sorted by
// ID. It takes no locks: an operation in progress may show half done.
func (m *Manager) List(ctx context.Context) ([]Status, error) {
	entries, err := os.ReadDir(m.root)
	if err != nil {
		return nil, fmt.Errorf("list MPS daemons: %w", err)
	}
	var out []Status
	for _, e := range entries {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !e.IsDir() || ValidateID(e.Name()) != nil {
			continue
		}
		dirs := dirsFor(m.root, e.Name())
		s := Status{Daemon: Daemon{Spec: Spec{ID: e.Name()}, Dirs: dirs}}
		st, err := readState(dirs)
		if err != nil {
			s.Err = err
			st = nil
		} else {
			s.Spec, s.Restarts = st.Spec, st.Restarts
		}
		if ref, ok := m.find(dirs, st); ok {
			s.Running, s.PID = true, ref.PID
		}
		out = append(out, s)
	}
	return out, nil
}

// lock serializes operations on one ID, for as long as ctx allows.
func (m *Manager) lock(ctx context.Context, id string) (func(), error) {
	m.mu.Lock()
	l := m.locks[id]
	if l == nil {
		l = &idLock{ch: make(chan struct{}, 1)}
		m.locks[id] = l
	}
	l.refs++
	m.mu.Unlock()
	release := func() {
		m.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(m.locks, id)
		}
		m.mu.Unlock()
	}
	began := time.Now()
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, fmt.Errorf("cancelled after %v waiting for another operation on it: %w", time.Since(began).Round(time.Millisecond), ctx.Err())
	}
}

func (m *Manager) emit(e Event) {
	if m.opts.onEvent != nil {
		m.opts.onEvent(e)
	}
}

// Supervised returns the IDs of the daemons this Manager supervises,
// sorted.
func (m *Manager) Supervised() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := make([]string, 0, len(m.supervised))
	for id := range m.supervised {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}
