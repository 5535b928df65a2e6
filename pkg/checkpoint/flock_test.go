package checkpoint

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestFileLockExcludes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	a, b := newFileLock(path), newFileLock(path)
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

func TestFileLockCancel(t *testing.T) {
	for _, joinAfterCancel := range []bool{false, true} {
		path := filepath.Join(t.TempDir(), "lock")
		l := newFileLock(path)
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
		unlock, err := newFileLock(path).Lock(ctx2)
		cancel2()
		if err != nil {
			t.Fatalf("lock still held after the cancelled wait: %v", err)
		}
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
