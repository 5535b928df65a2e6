package mps

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpudra/gpudra/pkg/proctable"
)

// find returns the running control daemon of dirs. The pid file is only
// believed when the process it names is a live control daemon (-d) that is
// either the very process recorded (same start time in the same boot) or,
// without a usable record, one serving this pipe directory: a PID reused by
// another program, or by another claim's daemon, is not taken for it.
func (m *Manager) find(dirs Dirs, st *state) (procRef, bool) {
	pid, err := readPIDFile(dirs)
	if err != nil {
		return procRef{}, false
	}
	ps, ok := m.proc.Alive(pid)
	if !ok || !m.proc.IsCommand(pid, filepath.Base(m.opts.binary), "-d") {
		return procRef{}, false
	}
	ref := procRef{PID: pid, StartTime: ps.StartTime}
	if st != nil && st.Daemon != nil && st.Daemon.PID == pid && st.BootID != "" && st.BootID == m.bootID {
		return ref, st.Daemon.StartTime == ps.StartTime
	}
	pipe, found := m.proc.Environ(pid, EnvPipeDirectory)
	return ref, found && filepath.Clean(pipe) == dirs.Pipe
}

// startedAs checks what can be checked of a running daemon against spec:
// the limits can be applied again, but the devices and -M are fixed at
// start.
func (m *Manager) startedAs(ref procRef, spec Spec) error {
	argv, err := m.proc.Cmdline(ref.PID)
	if err != nil {
		return err
	}
	if multi := slices.Contains(argv[1:], "-M"); multi != spec.MultiUser {
		return fmt.Errorf("runs with multi-user %v, want %v", multi, spec.MultiUser)
	}
	devices, _ := m.proc.Environ(ref.PID, EnvVisibleDevices)
	if want := strings.Join(spec.DeviceUUIDs, ","); devices != want {
		return fmt.Errorf("serves devices %q, want %q", devices, want)
	}
	return nil
}

// launch starts the daemon of spec and applies its limits. restart says
// that it ran before and died. Once the daemon has been launched, a failure
// leaves no daemon of spec.ID running: whatever was forked is killed, even
// if ctx has ended.
func (m *Manager) launch(ctx context.Context, spec Spec, dirs Dirs, prev *state, restart bool) (Daemon, error) {
	if err := ctx.Err(); err != nil {
		return Daemon{}, fmt.Errorf("cancelled before the daemon was launched: %w", err)
	}
	if err := checkExecutable(m.opts.binary); err != nil {
		return Daemon{}, err
	}
	if err := dirs.create(); err != nil {
		return Daemon{}, err
	}
	st := &state{Spec: spec}
	if prev != nil {
		st.Restarts = prev.Restarts
	}
	if restart {
		st.Restarts++
	}
	// The spec goes to disk before the daemon exists, so that whatever
	// happens next, the directory says what it is for.
	if err := writeState(dirs, st); err != nil {
		return Daemon{}, fmt.Errorf("record daemon: %w", err)
	}
	// Never a second daemon on one pipe directory (it would not start, and
	// removing the pid file below would hide the first).
	if ref, ok := m.find(dirs, nil); ok {
		return Daemon{}, fmt.Errorf("a daemon already serves %s (pid %d) that gpudra's record does not name", dirs.Pipe, ref.PID)
	}
	// A daemon of this directory that the pid file does not name (its start
	// was cut short before it wrote the file, or the file was removed) can
	// be neither adopted nor supervised, and holds the directory's lock.
	if _, err := m.killStrays(ctx, spec.ID, dirs, "its pid file does not name it; starting a new daemon"); err != nil {
		return Daemon{}, err
	}
	if prev != nil && prev.Daemon != nil {
		m.waitExited(ctx, *prev.Daemon)
	}
	// The old pid file names a process that is not a daemon of this
	// directory; without it, the first pid file that appears is the new
	// daemon's.
	if err := os.Remove(filepath.Join(dirs.Pipe, PIDFileName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Daemon{}, err
	}
	argv := []string{m.opts.binary, "-d"}
	if spec.MultiUser {
		argv = append(argv, "-M")
	}
	req := LaunchRequest{ID: spec.ID, Argv: argv, Dirs: dirs, Env: proctable.MergeEnv(m.opts.daemonEnv, []string{
		EnvPipeDirectory + "=" + dirs.Pipe,
		EnvLogDirectory + "=" + dirs.Log,
		EnvVisibleDevices + "=" + strings.Join(spec.DeviceUUIDs, ","),
	})}

	began := time.Now()
	d, err := m.startDaemon(ctx, req, st)
	if err == nil {
		return d, nil
	}
	// The launcher may have forked the daemon before it failed or ctx
	// ended, and a daemon may come up without its pid file or its limits:
	// none may run on, unknown to gpudra or serving without limits.
	if _, kerr := m.killDaemons(context.WithoutCancel(ctx), dirs); kerr != nil {
		err = fmt.Errorf("%w; after that: %w", err, kerr)
	}
	if cerr := ctx.Err(); cerr != nil {
		// Cut short by the caller: neither a failure of the daemon nor the
		// start timeout.
		waited := time.Since(began).Round(time.Millisecond)
		if errors.Is(err, cerr) {
			return Daemon{}, fmt.Errorf("cancelled after %v: %w", waited, err)
		}
		return Daemon{}, fmt.Errorf("cancelled after %v (%w): %w", waited, cerr, err)
	}
	return Daemon{}, err
}

// startDaemon launches req's daemon, waits until it is up, records it in st
// and applies its limits. After a failure, launch kills what it started.
func (m *Manager) startDaemon(ctx context.Context, req LaunchRequest, st *state) (Daemon, error) {
	if err := m.opts.launcher.Launch(ctx, req); err != nil {
		return Daemon{}, err
	}
	ref, err := m.waitReady(ctx, req.Dirs, strings.Join(req.Argv, " "))
	if err != nil {
		return Daemon{}, err
	}
	st.Daemon, st.BootID = &ref, m.bootID
	if err := writeState(req.Dirs, st); err != nil {
		return Daemon{}, fmt.Errorf("record daemon: %w", err)
	}
	if err := m.applyLimits(ctx, st.Spec, req.Dirs); err != nil {
		return Daemon{}, err
	}
	return Daemon{Spec: st.Spec.clone(), Dirs: req.Dirs, PID: ref.PID, Restarts: st.Restarts}, nil
}

// waitReady waits for the daemon just launched to write its pid file and
// open its control socket.
func (m *Manager) waitReady(ctx context.Context, dirs Dirs, command string) (procRef, error) {
	caller := ctx
	ctx, cancel := context.WithTimeout(ctx, m.opts.startTimeout)
	defer cancel()
	base := filepath.Base(m.opts.binary)
	for {
		if pid, err := readPIDFile(dirs); err == nil {
			ps, alive := m.proc.Alive(pid)
			if !alive {
				return procRef{}, fmt.Errorf("%s: daemon pid %d exited: %s", command, pid, m.daemonOutput(dirs))
			}
			if !m.proc.IsCommand(pid, base, "-d") {
				return procRef{}, fmt.Errorf("%s: %s names pid %d, which is not %s -d", command, PIDFileName, pid, base)
			}
			if _, err := os.Stat(filepath.Join(dirs.Pipe, ControlSocketName)); err == nil {
				return procRef{PID: pid, StartTime: ps.StartTime}, nil
			}
		}
		select {
		case <-ctx.Done():
			if err := caller.Err(); err != nil {
				return procRef{}, fmt.Errorf("%s: daemon not up (%w): %s", command, err, m.daemonOutput(dirs))
			}
			return procRef{}, fmt.Errorf("%s: daemon not up after %v (%w): %s", command, m.opts.startTimeout, ctx.Err(), m.daemonOutput(dirs))
		case <-time.After(m.opts.pollInterval):
		}
	}
}

// daemonOutput is what the daemon said about its start, for errors.
func (m *Manager) daemonOutput(dirs Dirs) string {
	return fmt.Sprintf("%s: %q; %s: %q",
		ControlLogName, proctable.Tail(filepath.Join(dirs.Log, ControlLogName), 2048),
		launchOutName, proctable.Tail(filepath.Join(dirs.Log, launchOutName), 1024))
}

// waitExited waits, up to the start timeout, until the last thread of a
// daemon that died has exited and released the pipe directory's lock. A
// daemon killed a moment ago may still be exiting; one that is long gone
// costs nothing here.
func (m *Manager) waitExited(ctx context.Context, ref procRef) {
	deadline := time.Now().Add(m.opts.startTimeout)
	for m.proc.Exiting(ref) && time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(m.opts.pollInterval):
		}
	}
}

// waitGone waits up to timeout for ref to exit.
func (m *Manager) waitGone(ctx context.Context, ref procRef, timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for m.proc.Same(ref) {
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			return !m.proc.Same(ref)
		case <-time.After(m.opts.pollInterval):
		}
	}
	return true
}
