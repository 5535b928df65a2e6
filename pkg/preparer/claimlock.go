package preparer

import (
	"context"
	"sync"
)

// claimLocks are the in-process locks of claims, one per claim UID, which a
// context can stop waiting for. An entry lives while someone holds or
// waits for it, so claims never share a lock.
type claimLocks struct {
	mu   sync.Mutex
	held map[string]*claimLock
}

type claimLock struct {
	// sem holds a token while the claim is locked.
	sem chan struct{}
	// refs counts holders and waiters; guarded by claimLocks.mu.
	refs int
}

// lock blocks until it holds uid's lock or ctx ends, and returns the
// function that lets it go.
func (l *claimLocks) lock(ctx context.Context, uid string) (func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	l.mu.Lock()
	if l.held == nil {
		l.held = map[string]*claimLock{}
	}
	e := l.held[uid]
	if e == nil {
		e = &claimLock{sem: make(chan struct{}, 1)}
		l.held[uid] = e
	}
	e.refs++
	l.mu.Unlock()
	select {
	case e.sem <- struct{}{}:
		return func() {
			<-e.sem
			l.release(uid, e)
		}, nil
	case <-ctx.Done():
		l.release(uid, e)
		return nil, ctx.Err()
	}
}

func (l *claimLocks) release(uid string, e *claimLock) {
	l.mu.Lock()
	if e.refs--; e.refs == 0 {
		delete(l.held, uid)
	}
	l.mu.Unlock()
}
