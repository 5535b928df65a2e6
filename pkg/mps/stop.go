package mps

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"

	"k8s.io/klog/v2"
)

// Stop stops the daemon of id and removes its directories: quit through
// the control binary, and, if the daemon has not exited after the stop
// timeout, SIGKILL to it and to the servers it started. It is idempotent:
// an ID with nothing on disk is not an error. Supervision of id ends first,
// so the supervisor cannot start the daemon again behind Stop's back.
func (m *Manager) Stop(ctx context.Context, id string) error {
	if err := ValidateID(id); err != nil {
		return fmt.Errorf("stop MPS daemon: %w", err)
	}
	unlock, err := m.lock(ctx, id)
	if err != nil {
		return fmt.Errorf("stop MPS daemon %s: %w", id, err)
	}
	defer unlock()
	m.mu.Lock()
	delete(m.supervised, id)
	m.mu.Unlock()

	dirs := dirsFor(m.root, id)
	if _, err := os.Lstat(dirs.Root); errors.Is(err, fs.ErrNotExist) {
		if err := m.opts.launcher.Release(ctx, id); err != nil {
			return fmt.Errorf("stop MPS daemon %s: %w", id, err)
		}
		return nil
	}
	st, err := readState(dirs)
	if err != nil {
		// The pid file and the daemon's environment still identify it.
		st = nil
	}
	pid := 0
	if ref, ok := m.find(dirs, st); ok {
		pid = ref.PID
		if err := m.stopDaemon(ctx, id, dirs, ref); err != nil {
			return fmt.Errorf("stop MPS daemon %s: %w", id, err)
		}
	}
	// Servers left behind by a daemon that crashed hold GPU memory, and
	// nothing else will ever end them.
	m.killAll(ctx, m.proc.serversOf(dirs.Pipe, 0))
	if err := m.opts.launcher.Release(ctx, id); err != nil {
		return fmt.Errorf("stop MPS daemon %s: %w", id, err)
	}
	if err := os.RemoveAll(dirs.Root); err != nil {
		return fmt.Errorf("stop MPS daemon %s: %w", id, err)
	}
	klog.FromContext(ctx).Info("Stopped MPS control daemon", "mpsDaemon", id, "pid", pid)
	m.emit(Event{ID: id, Type: EventStopped, PID: pid})
	return nil
}

// stopDaemon asks the daemon to quit and kills it, and the servers it
// started, when it does not.
func (m *Manager) stopDaemon(ctx context.Context, id string, dirs Dirs, ref procRef) error {
	servers := m.proc.serversOf(dirs.Pipe, ref.PID)
	_, quitErr := m.control(ctx, id, dirs, "quit")
	if m.waitGone(ctx, ref, m.opts.stopTimeout) {
		// Servers outliving a daemon that quit have no clients left (the
		// claim is going away); they only hold GPU memory.
		m.killAll(ctx, servers)
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	servers = append(servers, m.proc.serversOf(dirs.Pipe, ref.PID)...)
	reason := fmt.Errorf("still running %v after \"quit\"", m.opts.stopTimeout)
	if quitErr != nil {
		reason = fmt.Errorf("%w: %w", reason, quitErr)
	}
	klog.FromContext(ctx).Info("Killing MPS control daemon", "mpsDaemon", id, "pid", ref.PID, "reason", reason.Error())
	if err := m.proc.kill(ref, syscall.SIGKILL); err != nil {
		return err
	}
	m.killAll(ctx, servers)
	if !m.waitGone(ctx, ref, m.opts.stopTimeout) {
		if err := ctx.Err(); err != nil {
			return err
		}
		return fmt.Errorf("daemon pid %d still running %v after SIGKILL", ref.PID, m.opts.stopTimeout)
	}
	m.emit(Event{ID: id, Type: EventKilled, PID: ref.PID, Err: reason})
	return nil
}

// killAll kills refs and waits, up to the stop timeout, until they are
// gone: when Stop returns, their GPU memory is free for the next claim.
func (m *Manager) killAll(ctx context.Context, refs []procRef) {
	for _, r := range refs {
		_ = m.proc.kill(r, syscall.SIGKILL)
	}
	for _, r := range refs {
		m.waitGone(ctx, r, m.opts.stopTimeout)
	}
}
