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
	knownRecords []string
	pool         string
	driverName   string
	lossEvidence func() (string, error)
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
// (NVIDIA files without a boot ID, files torn by a power loss, files in a
// version not read). When the boot time cannot be
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
// the file unreadable (someone or something damaged it) and moves it aside,
// or finds that another Store sharing the directory did so: from then on the
// Store fails every call with [ErrNeedsAdoption] until [Store.Recover]
// succeeds. Open reports the same finding in its OpenReport instead. f runs
// while a batch is committed, on the committer goroutine or on the
// goroutine of the caller whose request found it: it must return quickly
// and must not call the Store.
func WithCorruptHandler(f func(CorruptFile)) Option {
	return func(o *options) { o.onCorrupt = f }
}

// WithKnownRecords declares the names of the claim records
// ([claimstate.Claim.Records]) this process understands: those of every
// device configurator it can undo, whether or not the feature is enabled.
// Calls add up. A checkpoint that requires a record not declared is left
// alone like one of a newer schema version (errors match
// [ErrNewerVersion]), and an Update that stores such a record is refused.
// Without this option no record is known.
func WithKnownRecords(names ...string) Option {
	return func(o *options) { o.knownRecords = append(o.knownRecords, names...) }
}

// WithPool names this node's device pool (the node name). Devices read
// without a pool (written by a Store without this option) get it, so that
// the conflict checks, which compare pool and name, see them; and an
// Update that leaves a device without a pool is refused. Without this option pools are kept as read.
func WithPool(pool string) Option {
	return func(o *options) { o.pool = pool }
}

// WithDriverName names the DRA driver this plugin serves (gpu.nvidia.com by
// default). A checkpoint of NVIDIA's DRA driver is adopted at Open; the
// claims it had only started to prepare hold the devices of its allocation
// that belong to this driver.
func WithDriverName(name string) Option {
	return func(o *options) { o.driverName = name }
}

// WithLossEvidence has Open ask evidence, when checkpoint.json is missing
// (and no loss is pending already), whether claims may be prepared on the
// node all the same: a non-empty answer, which says what was found (the
// claims' CDI specs, say), means the file was lost, not that nothing was
// ever prepared. Open then records the loss in the adopt-pending marker
// before it writes anything, and the Store needs adoption
// ([ErrNeedsAdoption]) until [Store.Recover]: a process killed before its
// owner adopted the claims leaves the marker, never an empty checkpoint the
// next process would trust. An error counts as evidence: the Store cannot
// tell that nothing is prepared. Start record files of this boot
// ([StartedDirName]) are evidence with or without this option; without it,
// and without them, a missing file means no claims.
func WithLossEvidence(evidence func() (string, error)) Option {
	return func(o *options) { o.lossEvidence = evidence }
}
