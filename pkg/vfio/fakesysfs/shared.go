package fakesysfs

import (
	"bytes"
	"encoding/json"
	"os"

	"github.com/gpudra/gpudra/internal/lockedfile"
)

// Several processes may drive one state file, as two plugin instances of
// a rolling update drive one node's kernel: every call of the fake takes
// a lock on the file (flock(2) on <file>.lock) beside its own mutex, and
// first takes in what another process changed since it last read or wrote
// the file.

// lock takes the fake's lock, in this process and, with a state file,
// across the processes sharing it, and brings the fake up to the file.
// It returns the function that releases it. A file that cannot be locked
// or read leaves the fake as it was.
func (s *Sysfs) lock() (unlock func()) {
	s.mu.Lock()
	if s.stateFile == "" {
		return s.mu.Unlock
	}
	release, err := lockedfile.Exclusive(s.stateFile + ".lock")
	if err != nil {
		return s.mu.Unlock
	}
	_ = s.syncLocked()
	return func() {
		release()
		s.mu.Unlock()
	}
}

// syncLocked takes in the state file when it changed since this process
// last read or wrote it; the caller holds the lock.
func (s *Sysfs) syncLocked() error {
	data, err := os.ReadFile(s.stateFile)
	if err != nil || bytes.Equal(data, s.lastState) {
		return err
	}
	var st State
	if err := json.Unmarshal(data, &st); err != nil {
		return err
	}
	if st.Version != stateVersion {
		return nil
	}
	if err := s.restoreLocked(&st); err != nil {
		return err
	}
	s.lastState = data
	return nil
}
