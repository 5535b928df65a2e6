package checkpoint

import "time"

const (
	// DefaultBootIDPath is where Linux publishes the ID of the current boot.
	DefaultBootIDPath = "/proc/sys/kernel/random/boot_id"
	// DefaultProcStatPath is the file whose btime line gives the time the
	// current boot began.
	DefaultProcStatPath = "/proc/stat"
)

type options struct {
	bootIDPath   string
	procStatPath string
	now          func() time.Time
	onCorrupt    func(CorruptFile)
}

func defaultOptions() options {
	return options{
		bootIDPath:   DefaultBootIDPath,
		procStatPath: DefaultProcStatPath,
		now:          time.Now,
	}
}

// Option configures [Open].
type Option func(*options)

// WithBootIDPath reads the boot ID from path instead of
// [DefaultBootIDPath]. State written under another boot ID is discarded.
func WithBootIDPath(path string) Option {
	return func(o *options) { o.bootIDPath = path }
}

// WithProcStatPath reads the boot time (its "btime" line) from path instead
// of [DefaultProcStatPath]. A file last modified before the boot time is
// known to come from a previous boot even when its content cannot tell
// (v1 files, files torn by a power loss). When the boot time cannot be
// read, such files are treated as written in the current boot.
func WithProcStatPath(path string) Option {
	return func(o *options) { o.procStatPath = path }
}

// WithClock sets the clock that names moved-aside files; time.Now by
// default.
func WithClock(now func() time.Time) Option {
	return func(o *options) { o.now = now }
}

// WithCorruptHandler has f called when a Store that is already open finds
// the file unreadable (someone or something damaged it) and moves it aside;
// the Store then goes on with no prepared claims. Open reports the same
// finding in its OpenReport instead. f runs on the Store's committer
// goroutine: it must return quickly and must not call the Store.
func WithCorruptHandler(f func(CorruptFile)) Option {
	return func(o *options) { o.onCorrupt = f }
}
