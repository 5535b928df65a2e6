package health

import (
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Defaults of the republication of health changes: a change waits
// DefaultSettle for others that come with it (a GPU that falls off the bus
// raises an XID and then is lost), and republications are at least
// DefaultInterval apart, so a GPU flapping 100 times in 10 s causes at
// most about 11 of them, each writing only the slices whose devices'
// taints differ from what the API server has.
const (
	DefaultSettle   = 100 * time.Millisecond
	DefaultInterval = time.Second
)

// Debouncer coalesces changes into flushes: the first change of a quiet
// spell is flushed after settle, later ones at least interval after the
// previous flush; every change is flushed, none waits longer than
// settle + interval. It is safe for concurrent use.
type Debouncer struct {
	clock            clock.WithDelayedExecution
	settle, interval time.Duration
	flush            func()

	mu        sync.Mutex
	scheduled bool
	stopped   bool
	last      time.Time // when the previous flush was due
	timer     clock.Timer
	flushes   int
}

// NewDebouncer returns a debouncer calling flush. flush runs on the
// clock's goroutine (a fake clock's: the one that steps it), so it must
// not block and must not use the clock.
func NewDebouncer(c clock.WithDelayedExecution, settle, interval time.Duration, flush func()) *Debouncer {
	return &Debouncer{clock: c, settle: settle, interval: interval, flush: flush}
}

// Changed says something changed: a flush follows.
func (d *Debouncer) Changed() {
	d.mu.Lock()
	if d.scheduled || d.stopped {
		d.mu.Unlock()
		return
	}
	d.scheduled = true
	now := d.clock.Now()
	due := now.Add(d.settle)
	if next := d.last.Add(d.interval); next.After(due) {
		due = next
	}
	d.mu.Unlock()
	// The fake clock runs a due callback under its own lock, which the
	// callback must not wait for while Changed holds d.mu; so the timer
	// is made outside it.
	t := d.clock.AfterFunc(due.Sub(now), func() {
		d.mu.Lock()
		d.scheduled, d.last = false, due
		stopped := d.stopped
		if !stopped {
			d.flushes++
		}
		d.mu.Unlock()
		if !stopped {
			d.flush()
		}
	})
	d.mu.Lock()
	d.timer = t
	d.mu.Unlock()
}

// Flushes returns how many flushes ran.
func (d *Debouncer) Flushes() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.flushes
}

// Stop drops a pending flush; later changes are ignored.
func (d *Debouncer) Stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	if d.timer != nil {
		d.timer.Stop()
	}
}
