package mps

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// Stop stops the daemon of id and removes its directories: quit through
// the control binary, and, if the daemon has not exited after the stop
// timeout, SIGKILL to it and to the servers it started. A daemon of id that
// its pid file does not name (its start was cut short before it wrote the
// file, or the file or the whole directory was removed) is found in /proc
// by its pipe directory and killed. Stop succeeds only once no daemon of id
// runs. It is idempotent: an ID with nothing on disk and nothing running is
// not an error. Supervision of id ends first, so the supervisor cannot start
// the daemon again behind Stop's back.
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
	_, err = os.Lstat(dirs.Root)
	exists := !errors.Is(err, fs.ErrNotExist)
	pid := 0
	if exists {
		st, err := readState(dirs)
		if err != nil {
			// The pid file and the daemon's environment still identify it.
			st = nil
		}
		if ref, ok := m.find(dirs, st); ok {
			pid = ref.PID
			if err := m.stopDaemon(ctx, id, dirs, ref); err != nil {
				return fmt.Errorf("stop MPS daemon %s: %w", id, err)
			}
		}
	}
	strays, err := m.killStrays(ctx, id, dirs, "its pid file does not name it")
	if err != nil {
		return fmt.Errorf("stop MPS daemon %s: %w", id, err)
	}
	if pid == 0 && len(strays) > 0 {
		pid = strays[0].PID
	}
	// Servers left behind by a daemon that crashed hold GPU memory, and
	// nothing else will ever end them.
	m.killAll(ctx, m.proc.serversOf(dirs.Pipe, 0))
	if err := m.opts.launcher.Release(ctx, id); err != nil {
		return fmt.Errorf("stop MPS daemon %s: %w", id, err)
	}
	if !exists && len(strays) == 0 {
		return nil
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
	if err := m.proc.Kill(ref, syscall.SIGKILL); err != nil {
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
		_ = m.proc.Kill(r, syscall.SIGKILL)
	}
	for _, r := range refs {
		m.waitGone(ctx, r, m.opts.stopTimeout)
	}
}

// killStrays kills the daemons of dirs that run (see killDaemons), with
// the servers they started, and reports each one killed, with reason.
func (m *Manager) killStrays(ctx context.Context, id string, dirs Dirs, reason string) ([]procRef, error) {
	killed, err := m.killDaemons(ctx, dirs)
	for _, ref := range killed {
		klog.FromContext(ctx).Info("Killed MPS control daemon", "mpsDaemon", id, "pid", ref.PID, "reason", reason)
		m.emit(Event{ID: id, Type: EventKilled, PID: ref.PID, Err: errors.New(reason)})
	}
	return killed, err
}

// daemonsNow returns the daemons of pipe that run. A look through /proc
// lists the processes first and reads each one after; a -d invocation that
// forks its daemon and exits in between is missed, and so is the daemon,
// which was not listed yet. A launcher orphaned by a killed plugin does
// exactly that, whenever it gets to run (chaos seed 508). So a look that
// finds none is taken again: the daemon was forked before its launcher
// exited, so it is in the second list.
//
// A daemon forked by a launcher that was killed in the middle of the fork
// can still be in its exec when the two looks run, with no command line
// to match (the test TestCancelledStartThenStopLeavesNoDaemon caught one
// that way): while some process shows none, the look is taken again, a
// few milliseconds apart, for at most unsettledWait.
func (m *Manager) daemonsNow(base, pipe string) []procRef {
	if daemons := m.proc.daemonsOf(base, pipe); len(daemons) > 0 {
		return daemons
	}
	deadline := time.Now().Add(unsettledWait)
	for {
		daemons, unsettled := m.proc.daemonsAndUnsettled(base, pipe)
		if len(daemons) > 0 || !unsettled || time.Now().After(deadline) {
			return daemons
		}
		time.Sleep(unsettledPoll)
	}
}

// How long daemonsNow waits for processes in the middle of an exec.
const (
	unsettledWait = 500 * time.Millisecond
	unsettledPoll = 5 * time.Millisecond
)

// maxKillRounds bounds how often killDaemons looks for daemons again.
const maxKillRounds = 3

// killDaemons SIGKILLs every daemon of dirs that runs, found in /proc by
// its pipe directory whatever its pid file says, and the servers it
// started, and waits (up to the stop timeout) until they are gone. A -d
// invocation killed while forking may leave a daemon behind, so it looks
// again until it finds none. It returns the daemons it killed; the error
// says that one still runs or that ctx ended first.
func (m *Manager) killDaemons(ctx context.Context, dirs Dirs) ([]procRef, error) {
	base := filepath.Base(m.opts.binary)
	var killed []procRef
	for range maxKillRounds {
		daemons := m.daemonsNow(base, dirs.Pipe)
		if len(daemons) == 0 {
			_ = os.Remove(filepath.Join(dirs.Pipe, PIDFileName))
			return killed, nil
		}
		refs := slices.Clone(daemons)
		for _, d := range daemons {
			refs = append(refs, m.proc.serversOf(dirs.Pipe, d.PID)...)
		}
		m.killAll(ctx, refs)
		killed = append(killed, daemons...)
		if err := ctx.Err(); err != nil {
			return killed, err
		}
		for _, d := range daemons {
			if m.proc.Same(d) {
				return killed, fmt.Errorf("daemon pid %d still running %v after SIGKILL", d.PID, m.opts.stopTimeout)
			}
		}
	}
	if daemons := m.daemonsNow(base, dirs.Pipe); len(daemons) > 0 {
		return killed, fmt.Errorf("daemon pid %d still running after %d rounds of SIGKILL to every daemon of %s", daemons[0].PID, maxKillRounds, dirs.Pipe)
	}
	return killed, nil
}
