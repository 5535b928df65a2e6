// Package filelock takes an exclusive flock(2) on a file for processes
// that share state through files beside it: the simulated hardware and
// time slices that two plugin instances of a rolling update drive.
package filelock

import (
	"errors"
	"os"

	"golang.org/x/sys/unix"
)

// Exclusive takes an exclusive flock(2) on the file at path, made if
// missing, waiting for it (a signal does not cut the wait short), and
// returns the function that releases it. The lock is on a descriptor of
// its own, so two calls exclude each other within one process too.
func Exclusive(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() { _ = f.Close() }, nil // closing releases the lock
}
