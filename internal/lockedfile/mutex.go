package lockedfile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// Mutex is an exclusive flock(2) on one lock file, which a context can
// stop waiting for: the lock that serialises the processes sharing a
// state file (the checkpoint's read-modify-write cycles, the time slices
// of a node).
//
// flock(2) cannot be interrupted from another thread, so a blocking wait
// runs in a goroutine (on its own OS thread, for as long as it waits). A
// caller whose context ends stops waiting at once; the goroutine carries on
// and, once it holds the lock, hands it to the next caller waiting or lets
// it go immediately. Callers never poll. The cost of a cancelled wait is
// therefore one blocked thread until the holder lets go, and a moment of
// holding the lock after that; at most one such goroutine exists per
// fileLock, because later callers join the wait in progress instead of
// starting another.
//
// Each acquisition opens the lock file anew: flock(2) locks belong to an
// open file description, so two descriptors exclude each other even inside
// one process, and an unlock can never release a lock that another
// acquisition got on a shared descriptor.
type Mutex struct {
	path string

	mu sync.Mutex
	// waiting is set while a goroutine is blocked in flock(2).
	waiting bool
	// waiters are the callers waiting for it, oldest first.
	waiters []chan lockResult
}

type lockResult struct {
	fd  int
	err error
}

// NewMutex returns the lock of the file at path, which Lock and TryLock
// create if missing (mode 0600). The file is never removed by this
// package: a process that locked a removed file would exclude no one.
func NewMutex(path string) *Mutex { return &Mutex{path: path} }

// Path is the lock file's path.
func (l *Mutex) Path() string { return l.path }

// Lock blocks until it holds the lock or ctx ends. It returns the function
// that lets the lock go.
func (l *Mutex) Lock(ctx context.Context) (unlock func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	if !l.waiting {
		fd, err := l.open()
		if err != nil {
			l.mu.Unlock()
			return nil, err
		}
		err = flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			l.mu.Unlock()
			return func() { release(fd) }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			l.mu.Unlock()
			_ = unix.Close(fd)
			return nil, fmt.Errorf("flock %s: %w", l.path, err)
		}
		l.waiting = true
		go l.wait(fd)
	}
	ch := make(chan lockResult, 1)
	l.waiters = append(l.waiters, ch)
	l.mu.Unlock()

	select {
	case r := <-ch:
		if r.err != nil {
			return nil, r.err
		}
		return func() { release(r.fd) }, nil
	case <-ctx.Done():
		l.mu.Lock()
		n := len(l.waiters)
		l.waiters = slices.DeleteFunc(l.waiters, func(c chan lockResult) bool { return c == ch })
		handed := len(l.waiters) == n
		l.mu.Unlock()
		if handed {
			// The lock arrived as ctx ended: give it back.
			if r := <-ch; r.err == nil {
				release(r.fd)
			}
		}
		return nil, ctx.Err()
	}
}

// TryLock takes the lock if it is free now, without waiting: ok is false
// when another process holds it or a wait for it is in progress here (a
// caller that then waits with Lock queues behind that wait).
func (l *Mutex) TryLock() (unlock func(), ok bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.waiting {
		return nil, false, nil
	}
	fd, err := l.open()
	if err != nil {
		return nil, false, err
	}
	err = flock(fd, unix.LOCK_EX|unix.LOCK_NB)
	if err == nil {
		return func() { release(fd) }, true, nil
	}
	_ = unix.Close(fd)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return nil, false, nil
	}
	return nil, false, fmt.Errorf("flock %s: %w", l.path, err)
}

// wait blocks in flock(2) on fd and hands the lock to the oldest waiter.
func (l *Mutex) wait(fd int) {
	err := flock(fd, unix.LOCK_EX)
	if err != nil {
		_ = unix.Close(fd)
		err = fmt.Errorf("flock %s: %w", l.path, err)
	}
	l.mu.Lock()
	if len(l.waiters) == 0 {
		// Every caller gave up.
		l.waiting = false
		l.mu.Unlock()
		if err == nil {
			release(fd)
		}
		return
	}
	first := l.waiters[0]
	l.waiters = l.waiters[1:]
	if len(l.waiters) > 0 {
		// The others go on waiting, on a descriptor of their own.
		if nfd, oerr := l.open(); oerr == nil {
			go l.wait(nfd)
		} else {
			for _, c := range l.waiters {
				c <- lockResult{err: oerr}
			}
			l.waiters = nil
			l.waiting = false
		}
	} else {
		l.waiting = false
	}
	l.mu.Unlock()
	first <- lockResult{fd: fd, err: err}
}

// open opens the lock file, creating it if needed.
func (l *Mutex) open() (int, error) { return openLockFile(l.path) }

// flock calls flock(2), retrying when a signal interrupts it.
func flock(fd, how int) error {
	return RetryEINTR(func() error { return unix.Flock(fd, how) })
}

func release(fd int) {
	// Closing the last descriptor releases the lock too; unlocking first
	// makes the release independent of descriptors anyone else may hold.
	_ = flock(fd, unix.LOCK_UN)
	_ = unix.Close(fd)
}

// openLockFile opens a lock file for writing, creating it if needed. A raw
// descriptor, not an os.File: os.OpenFile would spend five more system
// calls trying to register a regular file with the network poller.
// O_CLOEXEC: child processes never inherit a lock.
func openLockFile(path string) (int, error) {
	var fd int
	err := RetryEINTR(func() error {
		var oerr error
		fd, oerr = unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
		return oerr
	})
	if err != nil {
		return -1, fmt.Errorf("open lock file: %w", err)
	}
	return fd, nil
}
