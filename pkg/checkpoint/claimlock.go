package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// ClaimLockFileName is the file in the data directory whose bytes lock
// claims (LockClaim). Like the checkpoint's lock file it is never removed:
// a process that removed it could not know whether another one holds a
// lock in it.
const ClaimLockFileName = "claims.lock"

// LockClaim takes the lock of one claim across every process sharing the
// Store's directory (two plugin instances during a rolling update), so
// that a claim's Prepare, Unprepare and sweep, each of several
// transactions, exclude each other there as they do in one process. It
// blocks until it holds the lock or ctx ends, and returns the function
// that lets the lock go (once; calling it again does nothing).
//
// The lock is an open file description lock (F_OFD_SETLKW) on one byte of
// ClaimLockFileName, at an offset hashed from the claim UID: no file per
// claim to clean up, and with 2^62 offsets two claims share one never in
// practice. Each acquisition opens the file anew, so two acquisitions
// exclude each other inside one process too; callers still take an
// in-process lock first, so that waiters there park on a channel rather
// than in the kernel. The hash is part of the contract between plugin
// versions: changing it lets two versions hold one claim at once.
//
// A wait runs in a goroutine (on its own OS thread, for as long as it
// waits), since fcntl(2) cannot be interrupted from another thread. A
// caller whose context ends stops waiting at once; the goroutine carries
// on and lets the lock go as soon as it gets it. The cost of a cancelled
// wait is a blocked thread until the holder lets go.
func (s *Store) LockClaim(ctx context.Context, uid string) (unlock func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	path := filepath.Join(filepath.Dir(s.path), ClaimLockFileName)
	fd, err := openLockFile(path)
	if err != nil {
		return nil, err
	}
	off := claimLockOffset(uid)
	err = setClaimLock(fd, off, unix.F_WRLCK, false)
	if err == nil {
		return claimUnlocker(fd, off), nil
	}
	if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EACCES) {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("lock claim %s in %s: %w", uid, path, err)
	}
	got := make(chan error, 1)
	go func() { got <- setClaimLock(fd, off, unix.F_WRLCK, true) }()
	select {
	case err := <-got:
		if err != nil {
			_ = unix.Close(fd)
			return nil, fmt.Errorf("lock claim %s in %s: %w", uid, path, err)
		}
		return claimUnlocker(fd, off), nil
	case <-ctx.Done():
		go func() {
			// Closing the descriptor lets the lock go if the wait got it.
			<-got
			_ = unix.Close(fd)
		}()
		return nil, ctx.Err()
	}
}

// claimLockOffset is the byte of ClaimLockFileName that locks a claim:
// FNV-1a of its UID, in the non-negative range of off_t less one bit.
func claimLockOffset(uid string) int64 {
	h := fnv.New64a()
	_, _ = io.WriteString(h, uid)
	return int64(h.Sum64() >> 2)
}

// setClaimLock sets (F_WRLCK) or clears (F_UNLCK) the lock of one byte,
// waiting for it when wait is set; a signal does not cut a wait short.
func setClaimLock(fd int, off int64, typ int16, wait bool) error {
	cmd := unix.F_OFD_SETLK
	if wait {
		cmd = unix.F_OFD_SETLKW
	}
	return retryEINTR(func() error {
		// Pid must be 0 for an open file description lock.
		lk := unix.Flock_t{Type: typ, Whence: io.SeekStart, Start: off, Len: 1}
		return unix.FcntlFlock(uintptr(fd), cmd, &lk)
	})
}

// claimUnlocker lets the lock of one byte go and closes its descriptor,
// once.
func claimUnlocker(fd int, off int64) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			// Closing the descriptor would release the lock too; clearing it
			// first makes the release independent of any copy of it.
			_ = setClaimLock(fd, off, unix.F_UNLCK, false)
			_ = unix.Close(fd)
		})
	}
}

// openLockFile opens a lock file for writing, creating it if needed. A raw
// descriptor, not an os.File: os.OpenFile would spend five more system
// calls trying to register a regular file with the network poller.
// O_CLOEXEC: child processes never inherit a lock.
func openLockFile(path string) (int, error) {
	var fd int
	err := retryEINTR(func() error {
		var oerr error
		fd, oerr = unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
		return oerr
	})
	if err != nil {
		return -1, fmt.Errorf("open lock file: %w", err)
	}
	return fd, nil
}
