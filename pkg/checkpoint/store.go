package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/internal/lockedfile"
	"github.com/gpudra/gpudra/pkg/claimstate"
)

const (
	// FileName is the checkpoint file in the data directory.
	FileName = "checkpoint.json"
	// LockFileName is the lock file in the data directory. It is never
	// deleted: a process that locked a deleted file would exclude no one.
	LockFileName = "checkpoint.lock"
)

// ErrClosed is returned by the methods of a closed Store.
var ErrClosed = errors.New("checkpoint store is closed")

// OpenReport tells what Open found on disk and did about it. The zero value
// means the file was current and was used as it was.
type OpenReport struct {
	// Migrated is the format the file was converted from, NVIDIAv1 or
	// NVIDIAv2 (see NVIDIA), or "": every gpudra version this plugin reads
	// is one it writes. The file has been rewritten in gpudra's format
	// (when Corrupt is set too, it will be at Recover).
	Migrated string
	// BootIDChanged reports that the file held state of a previous boot,
	// which was discarded: the devices it describes were reset by the
	// reboot. This includes a file left unreadable by a power loss (moved
	// aside, see docs/design/checkpoint.md), which is expected and not Corrupt.
	BootIDChanged bool
	// Corrupt is set when the checkpoint of the current boot was lost: Open
	// moved an unreadable file (or a directory, socket, ... in its place)
	// aside, or found that an earlier process did and the claims were never
	// adopted (Err says so). The Store then holds no prepared claims and
	// needs adoption: every call but Recover fails with an error matching
	// ErrNeedsAdoption until Recover succeeds.
	Corrupt *CorruptFile
	// NewerVersion is the schema version of a file this plugin must not
	// overwrite, or "": a version newer than it knows, or one whose claims
	// hold records it does not know (UnknownRecords). The Store leaves
	// such a file alone: Update and Read fail with an error matching
	// ErrNewerVersion until it is replaced.
	NewerVersion string
	// UnknownRecords names, comma-separated and sorted, the records the
	// file requires that this plugin does not know (see WithKnownRecords);
	// "" when NewerVersion is a newer version.
	UnknownRecords string
	// Missing reports that there was no checkpoint.json (nor a link to
	// one). With WithLossEvidence, a missing file on a node that shows
	// prepared claims is a loss: Corrupt is set too, with an empty Path.
	Missing bool
	// NVIDIA is set when checkpoint.json was NVIDIA's DRA driver's: its
	// claims were converted into gpudra records (unless BootIDChanged
	// says they were of a previous boot) and the file was rewritten in
	// gpudra's format, the original kept at NVIDIA.KeptAt. Migrated is
	// NVIDIAv1 or NVIDIAv2 then.
	NVIDIA *NVIDIAAdoption
}

// NVIDIAAdoption describes an NVIDIA DRA driver checkpoint adopted at Open.
type NVIDIAAdoption struct {
	// Format is NVIDIAv1 or NVIDIAv2.
	Format string
	// KeptAt is the copy of NVIDIA's file, checkpoint.json.nvidia-<time>.
	KeptAt string
	// Claims is how many claims the file recorded (and were adopted, unless
	// the file was of a previous boot); Started of them were only started
	// (gpudra rolls them back before preparing them again).
	Claims, Started int
	// Skipped counts started claims dropped because they held no device of
	// this driver: NVIDIA had set nothing up for them.
	Skipped int
}

// CorruptFile is an unreadable checkpoint that was moved aside (or one
// that disappeared under a running Store).
type CorruptFile struct {
	// Path is where the file is now; "" when it disappeared.
	Path string
	// Err says why it could not be read.
	Err error
}

// Store is the prepared-claim state of this node, kept in
// dir/checkpoint.json and shared through that file with every other process
// that opens a Store on dir. Its methods are safe for concurrent use.
//
// One goroutine at a time does all reads and writes of the file: it takes
// the flock, re-reads the file only if someone else replaced it, applies
// every queued mutation, writes once, and lets the flock go. That is the
// caller itself when nobody else is committing and the flock is free
// (group commit led by the first caller, without a hand-off), otherwise a
// committer goroutine.
//
// When the file is lost (found unreadable, not a regular file, or gone
// under the Store), the Store does not go on with an empty state: every
// call fails with ErrNeedsAdoption until the owner has adopted the claims
// still prepared on the node with Recover. The adopt-pending marker in the
// directory carries that condition to every process sharing it.
type Store struct {
	path       string
	markerPath string
	schema     schema
	bootID     string
	bootTime   time.Time // zero when unknown
	now        func() time.Time
	logger     klog.Logger
	lock       *lockedfile.Mutex

	// ctx ends at Close; the committer waits for the flock under it.
	ctx     context.Context
	cancel  context.CancelFunc
	kick    chan struct{}
	stopped chan struct{}

	mu    sync.Mutex
	queue []*request
	// committing is set while one goroutine (the committer, or a caller
	// leading its own batch) commits: only it touches the file state.
	committing bool
	closed     bool
	pub        snapshot // the latest committed view, for Read's fast path
	// leaders counts callers committing inline, for Close to wait for.
	leaders sync.WaitGroup

	// Owned by whoever is committing (and by Open before the Store starts).
	cur  snapshot
	data []byte // see loaded.data
	enc  claimEncoder
	pin  io.Closer // the file cur.id names, kept open so its inode is not reused

	writes      atomic.Int64 // files written; for metrics, tests and benchmarks
	writeErrors atomic.Int64 // writes that failed; for metrics
	onCorrupt   func(CorruptFile)
	// lossEvidence is WithLossEvidence's; nil when not set.
	lossEvidence func() (string, error)
}

// snapshot is the state as of one version of the file and of the
// adopt-pending marker. The state is never modified once in a snapshot:
// mutations apply to clones.
type snapshot struct {
	state *claimstate.State  // nil when newer != nil
	id    fileID             // of checkpoint.json
	newer *newerVersionError // a file this Store must not overwrite
	// lost is the pending loss of the checkpoint (the marker's content);
	// nil when none is pending.
	lost     *lossRecord
	markerID fileID
}

// request is one queued Update or Recover (mutate != nil) or Read.
type request struct {
	mutate  func(*claimstate.State) error
	recover bool
	// requireAdoption, for RequireAdoption, is the loss to record.
	requireAdoption *lossRecord
	taken           bool // guarded by Store.mu: its batch is being committed
	done            chan struct{}

	err      error
	state    *claimstate.State // a Read's result
	panicked error             // mutate's panic, raised again in the caller
}

// Open loads dir/checkpoint.json, creating dir if needed, and starts the
// Store. State of a previous boot is discarded, NVIDIA's DRA driver
// checkpoint adopted, an unreadable file (a version this plugin does not
// read included, or anything but a regular file) moved aside, a newer
// version left alone: the report tells which. Open fails only when the
// directory, lock, boot ID or file cannot be accessed, or ctx ends while it
// waits for the lock; never because of what the file contains.
func Open(ctx context.Context, dir string, opts ...Option) (*Store, OpenReport, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	logger := klog.FromContext(ctx).WithValues("checkpoint", filepath.Join(dir, FileName))
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, OpenReport{}, fmt.Errorf("open checkpoint: create directory: %w", err)
	}
	bootID, err := readBootID(o.bootIDPath)
	if err != nil {
		return nil, OpenReport{}, fmt.Errorf("open checkpoint in %s: %w", dir, err)
	}
	bootTime, err := readBootTime(o.procStatPath)
	if err != nil {
		logger.Info("Boot time unknown: an unreadable checkpoint from before a power loss will be reported as corrupt", "err", err)
	}
	storeCtx, cancel := context.WithCancel(context.Background())
	s := &Store{
		path:       filepath.Join(dir, FileName),
		markerPath: filepath.Join(dir, AdoptPendingFileName),
		schema:     newSchema(o),
		bootID:     bootID,
		bootTime:   bootTime,
		now:        o.now,
		logger:     logger,
		lock:       lockedfile.NewMutex(filepath.Join(dir, LockFileName)),
		ctx:        storeCtx,
		cancel:     cancel,
		kick:       make(chan struct{}, 1),
		stopped:    make(chan struct{}),

		lossEvidence: o.lossEvidence,
	}
	report, err := s.open(ctx)
	// Set only now: Open reports what it finds in the OpenReport.
	s.onCorrupt = o.onCorrupt
	if err != nil {
		cancel()
		s.setPin(nil, fileID{})
		return nil, OpenReport{}, fmt.Errorf("open checkpoint in %s: %w", dir, err)
	}
	go s.run()
	return s, report, nil
}

func (s *Store) open(ctx context.Context) (OpenReport, error) {
	unlock, err := s.lock.Lock(ctx)
	if err != nil {
		return OpenReport{}, fmt.Errorf("lock %s: %w", s.lock.Path(), err)
	}
	defer unlock()
	s.removeStaleTemps()
	l, err := s.load()
	if err != nil {
		return OpenReport{}, err
	}
	s.useLoaded(l)
	if l.rewrite {
		data, err := s.enc.encode(s.bootID, s.cur.state)
		if err == nil {
			err = s.replace(data)
		}
		if err != nil {
			return OpenReport{}, err
		}
	}
	s.pub = s.cur
	report := OpenReport{Migrated: l.migrated, BootIDChanged: l.bootReset, Corrupt: l.corrupt, NVIDIA: l.nvidia, Missing: l.missing}
	if report.Corrupt == nil && l.lost != nil {
		report.Corrupt = l.lost.corruptFile()
	}
	if l.newer != nil {
		report.NewerVersion = l.newer.version
		report.UnknownRecords = strings.Join(l.newer.unknown, ",")
	}
	return report, nil
}

// Update applies mutate to a clone of the freshest state (re-read first if
// another process replaced the file) and persists the result. While the
// checkpoint needs adoption it fails with an error matching
// ErrNeedsAdoption without running mutate (see Recover).
//
// Updates queued while a write is in flight are applied in order and
// persisted together with one write; each caller learns its own result. If
// mutate returns an error, or leaves a state the file cannot hold, its
// changes are discarded and Update returns that error; otherwise Update
// returns the write error, if any, in which case nothing changed. A panic
// in mutate is raised again in the caller.
//
// mutate runs with the flock held and other mutations waiting, on the
// caller's goroutine or on the one committing a batch it joined: it must
// be quick, do no I/O, and never call back into the Store (that would
// deadlock).
//
// Update returns ctx.Err() only when mutate has not run and never will; once
// its batch is being committed, Update waits for the true outcome
// even if ctx ends.
func (s *Store) Update(ctx context.Context, mutate func(*claimstate.State) error) error {
	if mutate == nil {
		return errors.New("checkpoint: Update with a nil mutation")
	}
	return s.do(ctx, &request{mutate: mutate})
}

// Read returns a deep copy of the freshest state. When the file is the one
// this Store last read or wrote, that costs a stat and a copy; when another
// process replaced it, the file is re-read under the flock. While the
// checkpoint needs adoption, Read fails with an error matching
// ErrNeedsAdoption: the state it would return is incomplete.
func (s *Store) Read(ctx context.Context) (*claimstate.State, error) {
	var out *claimstate.State
	err := s.View(ctx, func(st *claimstate.State) error {
		out = st.Clone()
		return nil
	})
	return out, err
}

// View calls fn with the freshest state, like Read but without copying it:
// fn must not modify the state nor keep references into it after it
// returns. It serves hot paths that look at one claim of many. Like Read,
// it fails without calling fn while the checkpoint needs adoption.
func (s *Store) View(ctx context.Context, fn func(*claimstate.State) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	closed, pub := s.closed, s.pub
	s.mu.Unlock()
	if closed {
		return ErrClosed
	}
	// While a loss is pending, only a commit, which looks at the marker
	// under the flock, can tell whether someone recovered.
	if pub.newer == nil && pub.lost == nil && pub.id.known() {
		if id, err := statPath(s.path); err == nil && id == pub.id {
			return fn(pub.state)
		}
	}
	r := &request{}
	if err := s.do(ctx, r); err != nil {
		return err
	}
	return fn(r.state)
}

// Writes returns how many times this Store has written the file: with
// group commit, fewer than the Updates that changed it.
func (s *Store) Writes() int64 { return s.writes.Load() }

// WriteErrors counts the writes of the file that failed.
func (s *Store) WriteErrors() int64 { return s.writeErrors.Load() }

// Close stops the Store. A write in flight completes; requests still queued
// fail with ErrClosed. A flock(2) wait in progress goes on in the background
// until the lock is free, then lets it go.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	<-s.stopped
	s.leaders.Wait()
	s.failQueued(ErrClosed)
	s.setPin(nil, fileID{})
	return nil
}

// do queues r and waits for its outcome.
func (s *Store) do(ctx context.Context, r *request) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r.done = make(chan struct{})
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.queue = append(s.queue, r)
	lead := !s.committing
	if lead {
		s.committing = true
		s.leaders.Add(1)
	}
	s.mu.Unlock()
	if lead {
		s.lead()
	} else {
		s.wake()
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		s.mu.Lock()
		if !r.taken {
			s.queue = slices.DeleteFunc(s.queue, func(q *request) bool { return q == r })
			s.mu.Unlock()
			return ctx.Err()
		}
		s.mu.Unlock()
		<-r.done
	}
	if r.panicked != nil {
		panic(r.panicked)
	}
	return r.err
}
