package imex

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/gpudra/gpudra/pkg/proctable"
)

// Status is what the supervisor knows of the daemon.
type Status struct {
	// PID is the daemon's, 0 when none runs.
	PID int
	// Ready is set when the last check answered READY.
	Ready bool
	// LastCheck is what the last nvidia-imex-ctl -q printed.
	LastCheck string
	// LastError is why the last start failed.
	LastError string
	// Starts counts the daemons this supervisor started.
	Starts int
}

// Status returns the daemon's state.
func (s *Supervisor) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Status{Ready: s.ready, LastCheck: s.lastCheck, LastError: s.lastErr, Starts: s.starts}
	if s.ref != nil {
		st.PID = s.ref.PID
	}
	return st
}

// WaitReady waits until the daemon answers READY, giving up a little before
// ctx's deadline (the kubelet's, for Prepare) so that its error, not the
// deadline's, reaches the kubelet: it says how long it waited, what the
// last check printed, whether the daemon runs, and where its log is.
func (s *Supervisor) WaitReady(ctx context.Context) error {
	start := time.Now()
	if dl, ok := ctx.Deadline(); ok {
		margin := max(time.Second, time.Until(dl)/10)
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-margin))
		defer cancel()
	}
	s.poke()
	tick := time.NewTicker(s.o.CheckInterval)
	defer tick.Stop()
	for {
		s.mu.Lock()
		ready, ch := s.ready, s.readyCh
		s.mu.Unlock()
		if ready {
			return nil
		}
		select {
		case <-ch:
		case <-tick.C:
		case <-ctx.Done():
			return s.notReadyError(time.Since(start))
		}
	}
}

func (s *Supervisor) notReadyError(waited time.Duration) error {
	st := s.Status()
	running := fmt.Sprintf("no nvidia-imex runs (started %d times)", st.Starts)
	s.mu.Lock()
	ref := s.ref
	s.mu.Unlock()
	if ref != nil && s.table.Same(*ref) {
		running = fmt.Sprintf("nvidia-imex runs as pid %d (started %d times)", ref.PID, st.Starts)
	}
	if st.LastError != "" {
		running += "; last start failed: " + st.LastError
	}
	check := st.LastCheck
	if check == "" {
		check = "(not checked yet)"
	}
	log := s.o.Config.LogPath()
	return fmt.Errorf("the node's IMEX daemon is not ready after %v: last %s -q printed %q; %s; its log is %s (ends %q)",
		waited.Round(100*time.Millisecond), filepath.Base(s.o.Ctl), check, running, log, proctable.Tail(log, 512))
}

// check runs nvidia-imex-ctl -q.
func (s *Supervisor) check(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, ctlTimeout)
	defer cancel()
	cmd := exec.CommandContext(cctx, s.o.Ctl, "-c", s.o.Config.Path(), "-q")
	out, err := cmd.CombinedOutput()
	answer := strings.TrimSpace(string(out))
	if err != nil && answer == "" {
		answer = err.Error()
	}
	ready := err == nil && answer == ReadyAnswer
	if ready {
		s.mu.Lock()
		s.backoff = s.o.MinBackoff
		s.mu.Unlock()
	}
	s.setReady(ready, answer)
}

// setReady records readiness and the check's answer, and tells OnReady of
// a change.
func (s *Supervisor) setReady(ready bool, answer string) {
	s.mu.Lock()
	if answer != "" {
		s.lastCheck = answer
	}
	s.sinceChk = 0
	changed := s.ready != ready
	s.ready = ready
	if changed {
		if ready {
			close(s.readyCh)
		} else {
			s.readyCh = make(chan struct{})
		}
	}
	s.mu.Unlock()
	if changed && s.o.OnReady != nil {
		s.o.OnReady(ready)
	}
}
