package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"

	"golang.org/x/sys/unix"
)

// fileLock is an exclusive flock(2) on one lock file, which a context can
// stop waiting for.
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
type fileLock struct {
	path string

	mu sync.Mutex
	// waiting is set while a goroutine is blocked in flock(2).
	waiting bool
	// waiters are the callers waiting for it, oldest first.
	waiters []chan lockResult
}

type lockResult struct {
	f   *os.File
	err error
}

func newFileLock(path string) *fileLock { return &fileLock{path: path} }

// Lock blocks until it holds the lock or ctx ends. It returns the function
// that lets the lock go.
func (l *fileLock) Lock(ctx context.Context) (unlock func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	if !l.waiting {
		f, err := l.open()
		if err != nil {
			l.mu.Unlock()
			return nil, err
		}
		err = flock(f, unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			l.mu.Unlock()
			return func() { release(f) }, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			l.mu.Unlock()
			_ = f.Close()
			return nil, fmt.Errorf("flock %s: %w", l.path, err)
		}
		l.waiting = true
		go l.wait(f)
	}
	ch := make(chan lockResult, 1)
	l.waiters = append(l.waiters, ch)
	l.mu.Unlock()

	select {
	case r := <-ch:
		if r.err != nil {
			return nil, r.err
		}
		return func() { release(r.f) }, nil
	case <-ctx.Done():
		l.mu.Lock()
		n := len(l.waiters)
		l.waiters = slices.DeleteFunc(l.waiters, func(c chan lockResult) bool { return c == ch })
		handed := len(l.waiters) == n
		l.mu.Unlock()
		if handed {
			// The lock arrived as ctx ended: give it back.
			if r := <-ch; r.err == nil {
				release(r.f)
			}
		}
		return nil, ctx.Err()
	}
}

// wait blocks in flock(2) on f and hands the lock to the oldest waiter.
func (l *fileLock) wait(f *os.File) {
	err := flock(f, unix.LOCK_EX)
	if err != nil {
		_ = f.Close()
		err = fmt.Errorf("flock %s: %w", l.path, err)
	}
	l.mu.Lock()
	if len(l.waiters) == 0 {
		// Every caller gave up.
		l.waiting = false
		l.mu.Unlock()
		if err == nil {
			release(f)
		}
		return
	}
	first := l.waiters[0]
	l.waiters = l.waiters[1:]
	if len(l.waiters) > 0 {
		// The others go on waiting, on a descriptor of their own.
		if nf, oerr := l.open(); oerr == nil {
			go l.wait(nf)
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
	first <- lockResult{f: f, err: err}
}

func (l *fileLock) open() (*os.File, error) {
	// os.OpenFile sets O_CLOEXEC: child processes never inherit the lock.
	f, err := os.OpenFile(l.path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	return f, nil
}

// flock calls flock(2), retrying when a signal interrupts it.
func flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

func release(f *os.File) {
	// Closing the last descriptor releases the lock too; unlocking first
	// makes the release independent of descriptors anyone else may hold.
	_ = flock(f, unix.LOCK_UN)
	_ = f.Close()
}
