package mps

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"k8s.io/klog/v2"
)

// supervise puts spec's daemon under supervision, keeping any backoff in
// progress for it.
func (m *Manager) supervise(spec Spec) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.supervised[spec.ID]; ok {
		s.spec = spec.clone()
		return
	}
	m.supervised[spec.ID] = &supervision{spec: spec.clone()}
}

// Supervise checks the daemons this Manager started or adopted every
// interval, and starts again, with the same limits, each one that died,
// until ctx ends. A daemon whose restart fails is tried again after a
// backoff ([WithRestartBackoff]). Failures are logged and reported as
// events; Supervise itself never gives up.
func (m *Manager) Supervise(ctx context.Context, interval time.Duration) {
	t := m.opts.clock.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			_ = m.SuperviseOnce(ctx)
		}
	}
}

// SuperviseOnce is one pass of [Manager.Supervise]: every supervised daemon
// is checked once, and restarted if it died and its backoff has passed. The
// errors of failed restarts are returned, joined.
func (m *Manager) SuperviseOnce(ctx context.Context) error {
	var errs []error
	for _, id := range m.Supervised() {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := m.check(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// check restarts the daemon of id if it died.
func (m *Manager) check(ctx context.Context, id string) error {
	unlock, err := m.lock(ctx, id)
	if err != nil {
		return fmt.Errorf("check MPS daemon %s: %w", id, err)
	}
	defer unlock()
	m.mu.Lock()
	sup, ok := m.supervised[id]
	var spec Spec
	var next time.Time
	if ok {
		spec, next = sup.spec, sup.nextAttempt
	}
	m.mu.Unlock()
	if !ok {
		return nil // stopped while this pass waited for the lock
	}

	dirs := dirsFor(m.root, id)
	st, err := readState(dirs)
	if err != nil {
		// The supervisor's spec is the one the daemon was started with;
		// a damaged or missing record is rewritten from it.
		if !errors.Is(err, fs.ErrNotExist) {
			klog.FromContext(ctx).Error(err, "Unreadable MPS daemon record; rewriting it", "mpsDaemon", id)
		}
		st = nil
	}
	if _, ok := m.find(dirs, st); ok {
		m.mu.Lock()
		sup.failures, sup.nextAttempt = 0, time.Time{}
		m.mu.Unlock()
		return nil
	}
	now := m.opts.clock.Now()
	if now.Before(next) {
		return nil
	}
	logger := klog.FromContext(ctx).WithValues("mpsDaemon", id)
	logger.Info("MPS control daemon is not running; starting it again")
	d, err := m.launch(ctx, spec, dirs, st, true)
	if err != nil {
		m.restartFailed(ctx, id, err)
		return fmt.Errorf("restart MPS daemon %s: %w", id, err)
	}
	m.mu.Lock()
	sup.failures, sup.nextAttempt = 0, time.Time{}
	m.mu.Unlock()
	logger.Info("Restarted MPS control daemon", "pid", d.PID, "restarts", d.Restarts)
	m.emit(Event{ID: id, Type: EventRestarted, PID: d.PID})
	return nil
}

// restartFailed counts a failed restart and sets when the next may be.
func (m *Manager) restartFailed(ctx context.Context, id string, err error) {
	m.mu.Lock()
	var wait time.Duration
	if sup, ok := m.supervised[id]; ok {
		sup.failures++
		wait = m.opts.backoffInitial
		for i := 1; i < sup.failures && wait < m.opts.backoffMax; i++ {
			wait *= 2
		}
		wait = min(wait, m.opts.backoffMax)
		sup.nextAttempt = m.opts.clock.Now().Add(wait)
	}
	m.mu.Unlock()
	klog.FromContext(ctx).Error(err, "Restarting MPS control daemon failed", "mpsDaemon", id, "retryIn", wait)
	m.emit(Event{ID: id, Type: EventRestartFailed, Err: err})
}
