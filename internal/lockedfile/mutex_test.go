package lockedfile

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestMutexExcludes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	a, b := NewMutex(path), NewMutex(path)
	unlockA, err := a.Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan func(), 1)
	go func() {
		unlockB, err := b.Lock(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- unlockB
	}()
	select {
	case <-got:
		t.Fatal("second lock acquired while the first is held")
	case <-time.After(50 * time.Millisecond):
	}
	unlockA()
	select {
	case unlockB := <-got:
		unlockB()
	case <-time.After(10 * time.Second):
		t.Fatal("second lock not acquired after the first let go")
	}
}

func TestMutexCancel(t *testing.T) {
	for _, joinAfterCancel := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "lock")
		l := NewMutex(path)
		holder := rawLock(t, path)

		ctx, cancel := context.WithCancel(t.Context())
		result := make(chan error, 1)
		go func() {
			_, err := l.Lock(ctx)
			result <- err
		}()
		time.Sleep(20 * time.Millisecond) // let it block in flock(2)
		cancel()
		select {
		case err := <-result:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Lock = %v, want context.Canceled", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Lock did not return when its context ended")
		}

		if joinAfterCancel {
			// A later caller joins the wait still in flight.
			got := make(chan func(), 1)
			go func() {
				unlock, err := l.Lock(context.Background())
				if err != nil {
					t.Error(err)
				}
				got <- unlock
			}()
			_ = holder.Close()
			select {
			case unlock := <-got:
				unlock()
			case <-time.After(10 * time.Second):
				t.Fatal("Lock after a cancelled one never acquired")
			}
		} else {
			_ = holder.Close()
		}
		// The abandoned wait must not keep the lock.
		ctx2, cancel2 := context.WithTimeout(t.Context(), 10*time.Second)
		unlock, err := NewMutex(path).Lock(ctx2)
		cancel2()
		if err != nil {
			t.Fatalf("lock still held after the cancelled wait: %v", err)
		}
		unlock()
	}
}

// TestMutexTryLock: TryLock takes a free lock at once and never waits:
// not for another holder, nor behind a wait of Lock in flight.
func TestMutexTryLock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	l := NewMutex(path)
	unlock, ok, err := l.TryLock()
	if err != nil || !ok {
		t.Fatalf("TryLock of a free lock = %v, %v", ok, err)
	}
	if _, ok, err := NewMutex(path).TryLock(); err != nil || ok {
		t.Errorf("TryLock by a second holder = %v, %v, want not taken", ok, err)
	}
	unlock()

	holder := rawLock(t, path)
	if _, ok, err := l.TryLock(); err != nil || ok {
		t.Errorf("TryLock while another process holds the lock = %v, %v, want not taken", ok, err)
	}
	got := make(chan func(), 1)
	go func() {
		unlock, err := l.Lock(context.Background())
		if err != nil {
			t.Error(err)
		}
		got <- unlock
	}()
	deadline := time.Now().Add(10 * time.Second)
	for !l.isWaiting() {
		if time.Now().After(deadline) {
			t.Fatal("Lock never started waiting")
		}
		time.Sleep(time.Millisecond)
	}
	_ = holder.Close()
	unlock = <-got
	// The lock went to the waiter, not to a TryLock that came later.
	if _, ok, err := l.TryLock(); err != nil || ok {
		t.Errorf("TryLock while Lock's caller holds it = %v, %v, want not taken", ok, err)
	}
	unlock()
	if unlock, ok, err := l.TryLock(); err != nil || !ok {
		t.Errorf("TryLock once everyone let go = %v, %v", ok, err)
	} else {
		unlock()
	}
}

func rawLock(tb testing.TB, path string) *os.File {
	tb.Helper()
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		tb.Fatal(err)
	}
	return f
}

// isWaiting reports whether a wait for the lock is in flight.
func (l *Mutex) isWaiting() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waiting
}
