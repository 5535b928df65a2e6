package lockedfile_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/gpudra/gpudra/internal/lockedfile"
)

func TestExclusiveExcludesUntilReleased(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.lock")
	unlock, err := lockedfile.Exclusive(path)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan func(), 1)
	go func() {
		second, err := lockedfile.Exclusive(path)
		if err != nil {
			t.Error(err)
		}
		got <- second
	}()
	select {
	case <-got:
		t.Fatal("a second lock was taken while the first was held")
	case <-time.After(100 * time.Millisecond):
	}
	unlock()
	select {
	case second := <-got:
		second()
	case <-time.After(5 * time.Second):
		t.Fatal("the second lock was not taken after the first was released")
	}
}
