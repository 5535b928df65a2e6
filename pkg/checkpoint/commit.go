package checkpoint

import (
	"bytes"
	"fmt"
	"io"
	"runtime/debug"
	"slices"

	"github.com/gpudra/gpudra/internal/lockedfile"
	"github.com/gpudra/gpudra/pkg/claimstate"
)

// run is the committer: it serves what the callers could not commit
// themselves (the flock was held elsewhere, or requests queued while a
// batch was being committed).
func (s *Store) run() {
	defer close(s.stopped)
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.kick:
		}
		for s.ctx.Err() == nil && s.claimCommit() {
			s.commitNext()
			s.endCommit()
		}
	}
}

// claimCommit makes the caller the one goroutine committing, if none is
// and something is queued.
func (s *Store) claimCommit() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.committing || len(s.queue) == 0 {
		return false
	}
	s.committing = true
	return true
}

// endCommit ends a claimCommit (or a lead) and wakes the committer for
// whatever queued meanwhile.
func (s *Store) endCommit() {
	s.mu.Lock()
	s.committing = false
	more := len(s.queue) > 0
	s.mu.Unlock()
	if more {
		s.wake()
	}
}

func (s *Store) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Store) queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

// lead commits inline, on the calling goroutine, the batch that holds the
// caller's own request, when the flock is free at once: with no
// contention a request then costs no hand-off to the committer and back.
// When the flock is held elsewhere (another process, or a wait for it in
// flight), the committer waits for it instead, so that the caller can
// stop waiting when its context ends. The caller holds the commit
// (committing is set for it).
func (s *Store) lead() {
	defer s.leaders.Done()
	defer s.endCommit()
	unlock, ok, err := s.lock.TryLock()
	if err != nil || !ok {
		// The committer waits for the flock, or reports the error.
		return
	}
	s.serve(unlock)
}

// commitNext takes the flock, then every queued request, and serves them.
// Requests join the batch until the flock is held, not just until the
// previous write ends.
func (s *Store) commitNext() {
	unlock, err := s.lock.Lock(s.ctx)
	if err != nil {
		if s.ctx.Err() == nil {
			s.failQueued(fmt.Errorf("lock %s: %w", s.lock.Path(), err))
		}
		return
	}
	s.serve(unlock)
}

// serve takes every queued request, commits them, lets the flock go and
// tells the callers. A commit that panics (a bug; a mutation's panic is
// its caller's alone) fails the whole batch, lets the flock go and panics
// again, on the committer or on the caller that led the batch: no caller
// is told its update landed, and no other process waits on the flock.
func (s *Store) serve(unlock func()) {
	s.mu.Lock()
	batch := s.queue
	s.queue = nil
	for _, r := range batch {
		r.taken = true
	}
	s.mu.Unlock()
	finish := func() {
		unlock()
		for _, r := range batch {
			close(r.done)
		}
	}
	defer func() {
		if p := recover(); p != nil {
			for _, r := range batch {
				r.err = fmt.Errorf("checkpoint commit panicked: %v", p)
			}
			finish()
			panic(p)
		}
		finish()
	}()
	if len(batch) > 0 {
		s.commit(batch)
	}
}

func (s *Store) commit(batch []*request) {
	defer func() {
		s.mu.Lock()
		s.pub = s.cur
		s.mu.Unlock()
	}()
	err := s.refresh()
	if err == nil && s.cur.newer != nil {
		err = s.cur.newer
	}
	if err != nil {
		for _, r := range batch {
			r.err = err
		}
		return
	}
	if s.cur.lost != nil || slices.ContainsFunc(batch, requiresAdoption) {
		batch = s.serveWhileLost(batch)
	}
	next := s.cur.state
	var applied []*request
	for _, r := range batch {
		if r.mutate == nil {
			continue
		}
		if st, ok := r.apply(next, s.schema); ok {
			next = st
			applied = append(applied, r)
		}
	}
	if len(applied) > 0 {
		if err := s.persist(next); err != nil {
			for _, r := range applied {
				r.err = err
			}
		}
	}
	for _, r := range batch {
		if r.mutate == nil {
			r.state = s.cur.state.Clone()
		}
	}
}

// apply runs r's mutation on a clone of base and checks the result against
// sc.
func (r *request) apply(base *claimstate.State, sc schema) (next *claimstate.State, ok bool) {
	next = base.Clone()
	defer func() {
		if p := recover(); p != nil {
			r.panicked = fmt.Errorf("checkpoint: Update mutation panicked: %v\n\ncommitting goroutine's stack:\n%s", p, debug.Stack())
			next, ok = nil, false
		}
	}()
	if err := r.mutate(next); err != nil {
		r.err = err
		return nil, false
	}
	err := sc.validate(next)
	if err == nil {
		err = canonicalizeRecords(next)
	}
	if err != nil {
		r.err = fmt.Errorf("mutation left an invalid state: %w", err)
		return nil, false
	}
	return next, true
}

// persist writes next, unless the file already holds exactly it.
func (s *Store) persist(next *claimstate.State) error {
	data, err := s.enc.encode(s.bootID, next)
	if err != nil {
		return fmt.Errorf("encode checkpoint: %w", err)
	}
	if bytes.Equal(data, s.data) {
		s.enc.recycle(data)
	} else {
		prev := s.data
		if err := s.replace(data); err != nil {
			s.enc.recycle(data)
			return err
		}
		s.enc.recycle(prev)
	}
	s.cur.state = next
	return nil
}

// replace writes data as the new file and pins it.
func (s *Store) replace(data []byte) error {
	f, st, err := lockedfile.Replace(s.path, data)
	if err != nil {
		s.writeErrors.Add(1)
		return err
	}
	s.writes.Add(1)
	s.setPin(f, statTID(&st))
	s.data = data
	return nil
}

// refresh re-reads the file and the adopt-pending marker if either is not
// the one the Store last saw.
func (s *Store) refresh() error {
	id, err := statPath(s.path)
	if err != nil {
		return fmt.Errorf("stat %s: %w", s.path, err)
	}
	mid, err := statPath(s.markerPath)
	if err != nil {
		return fmt.Errorf("stat %s: %w", s.markerPath, err)
	}
	if id.known() && id == s.cur.id && mid == s.cur.markerID {
		return nil
	}
	l, err := s.load()
	if err != nil {
		return err
	}
	s.useLoaded(l)
	return nil
}

// useLoaded makes l the current snapshot and logs what load did.
func (s *Store) useLoaded(l loaded) {
	wasLost := s.cur.lost != nil
	s.setPin(l.pin, l.id)
	s.cur = l.snapshot
	s.data = l.data
	if l.migrated != "" {
		s.logger.Info("Migrating checkpoint", "from", l.migrated, "to", currentVersion)
	}
	if l.poolFilled > 0 {
		s.logger.Info("Devices recorded without a pool get this node's", "devices", l.poolFilled, "pool", s.schema.pool)
	}
	switch {
	case l.tornPath != "":
		s.logger.Info("Checkpoint of a previous boot was unreadable, as a power loss can leave it; moved aside", "movedTo", l.tornPath, "reason", l.tornErr.Error())
	case l.bootReset:
		s.logger.Info("Discarding checkpoint of a previous boot", "claims", l.discardedClaims, "bootID", s.bootID)
	}
	switch {
	case l.corrupt != nil && l.corrupt.Path == "":
		s.logger.Error(l.corrupt.Err, "Checkpoint disappeared; no prepared claims until the claims on the node are adopted")
		if s.onCorrupt != nil {
			s.onCorrupt(*l.corrupt)
		}
	case l.corrupt != nil:
		s.logger.Error(l.corrupt.Err, "Unreadable checkpoint moved aside; no prepared claims until the claims on the node are adopted", "movedTo", l.corrupt.Path)
		if s.onCorrupt != nil {
			s.onCorrupt(*l.corrupt)
		}
	case l.lost != nil && !wasLost:
		cf := l.lost.corruptFile()
		s.logger.Error(cf.Err, "Checkpoint lost; no prepared claims until the claims on the node are adopted", "movedTo", cf.Path)
		if s.onCorrupt != nil {
			s.onCorrupt(*cf)
		}
	case l.lost == nil && wasLost:
		s.logger.Info("Checkpoint recovered by another process")
	}
	if l.newer != nil {
		s.logger.Error(l.newer, "Checkpoint this plugin must not overwrite")
	}
}

func (s *Store) setPin(f io.Closer, id fileID) {
	if s.pin != nil && s.pin != f {
		_ = s.pin.Close()
	}
	s.pin = f
	s.cur.id = id
}

func (s *Store) failQueued(err error) {
	s.mu.Lock()
	batch := s.queue
	s.queue = nil
	for _, r := range batch {
		r.taken = true
		r.err = err
	}
	s.mu.Unlock()
	for _, r := range batch {
		close(r.done)
	}
}
