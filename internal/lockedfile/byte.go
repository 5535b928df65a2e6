package lockedfile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"golang.org/x/sys/unix"
)

// LockByte takes an open file description lock (F_OFD_SETLKW) on the byte
// at off of the file at path, made if missing: one file holds the locks of
// many things (the checkpoint's claims), with none to clean up. It blocks
// until it holds the lock or ctx ends, and returns the function that lets
// the lock go (once; calling it again does nothing). Each acquisition opens
// the file anew, so two acquisitions exclude each other inside one process
// too.
//
// A wait runs in a goroutine (on its own OS thread, for as long as it
// waits), since fcntl(2) cannot be interrupted from another thread. A
// caller whose context ends stops waiting at once; the goroutine carries
// on and lets the lock go as soon as it gets it. The cost of a cancelled
// wait is a blocked thread until the holder lets go.
func LockByte(ctx context.Context, path string, off int64) (unlock func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	fd, err := openLockFile(path)
	if err != nil {
		return nil, err
	}
	err = setByteLock(fd, off, unix.F_WRLCK, false)
	if err == nil {
		return byteUnlocker(fd, off), nil
	}
	if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EACCES) {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("lock byte %d of %s: %w", off, path, err)
	}
	got := make(chan error, 1)
	go func() { got <- setByteLock(fd, off, unix.F_WRLCK, true) }()
	select {
	case err := <-got:
		if err != nil {
			_ = unix.Close(fd)
			return nil, fmt.Errorf("lock byte %d of %s: %w", off, path, err)
		}
		return byteUnlocker(fd, off), nil
	case <-ctx.Done():
		go func() {
			// Closing the descriptor lets the lock go if the wait got it.
			<-got //nolint:errcheck // the wait failed or got the lock: close either way
			_ = unix.Close(fd)
		}()
		return nil, ctx.Err()
	}
}

// setByteLock sets (F_WRLCK) or clears (F_UNLCK) the lock of one byte,
// waiting for it when wait is set; a signal does not cut a wait short.
func setByteLock(fd int, off int64, typ int16, wait bool) error {
	cmd := unix.F_OFD_SETLK
	if wait {
		cmd = unix.F_OFD_SETLKW
	}
	return RetryEINTR(func() error {
		// Pid must be 0 for an open file description lock.
		lk := unix.Flock_t{Type: typ, Whence: io.SeekStart, Start: off, Len: 1}
		return unix.FcntlFlock(uintptr(fd), cmd, &lk)
	})
}

// byteUnlocker lets the lock of one byte go and closes its descriptor,
// once.
func byteUnlocker(fd int, off int64) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			// Closing the descriptor would release the lock too; clearing it
			// first makes the release independent of any copy of it.
			_ = setByteLock(fd, off, unix.F_UNLCK, false)
			_ = unix.Close(fd)
		})
	}
}
