package checkpoint

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpudra/gpudra/internal/lockedfile"
	"github.com/gpudra/gpudra/pkg/claimstate"
)

const (
	// corruptInfix names moved-aside files: checkpoint.json.corrupt-<UTC time>.
	corruptInfix = ".corrupt-"
	// maxFileSize bounds what is read; a bigger file is unreadable, not a
	// reason to exhaust memory. A node's claims take kilobytes.
	maxFileSize = 64 << 20
)

// fileID identifies one version of checkpoint.json on disk. Writers always
// rename a new file into place, so a new version has a new inode; while the
// Store keeps its last file open (pinned), that inode number cannot be
// reused, and comparing IDs tells whether anyone replaced the file. Size
// and mtime catch an editor that rewrites the file in place.
type fileID struct {
	missing  bool // no file at the path
	dev, ino uint64
	size     int64
	mtime    int64
}

// known reports whether id names something; the zero fileID means "not
// known" and never equals a fresh stat.
func (id fileID) known() bool { return id != fileID{} }

func statID(fi fs.FileInfo) fileID {
	id := fileID{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.dev, id.ino = uint64(st.Dev), uint64(st.Ino) //nolint:unconvert // types differ across platforms
	}
	return id
}

// statTID is statID of a stat(2) result.
func statTID(st *unix.Stat_t) fileID {
	return fileID{dev: uint64(st.Dev), ino: uint64(st.Ino), size: st.Size, mtime: st.Mtim.Nano()} //nolint:unconvert // types differ across platforms
}

// statPath stats path (following symlinks, as os.Stat), without
// allocating: Read's fast path and every commit call it.
func statPath(path string) (fileID, error) {
	var st unix.Stat_t
	err := lockedfile.RetryEINTR(func() error { return unix.Stat(path, &st) })
	if errors.Is(err, unix.ENOENT) {
		return fileID{missing: true}, nil
	}
	if err != nil {
		return fileID{}, err
	}
	return statTID(&st), nil
}

// loaded is what load found on disk and made of it.
type loaded struct {
	snapshot
	// pin is the open file of snapshot.id, when there is one.
	pin io.Closer
	// data is the file content when it holds snapshot.state in the current
	// version, so that an unchanged state is not written again.
	data []byte
	// rewrite is set when the file does not hold snapshot.state in the
	// current version: Open then writes it at once (unless the state was
	// lost: then nothing is written before Recover).
	rewrite bool

	migrated  string
	bootReset bool
	// discardedClaims counts the claims of a previous boot dropped.
	discardedClaims int
	// poolFilled counts the devices read without a pool that got this
	// node's.
	poolFilled int
	// tornPath and tornErr describe an unreadable file of a previous boot,
	// moved aside quietly.
	tornPath string
	tornErr  error
	// corrupt is the unreadable file of the current boot this load moved
	// aside (or found gone); snapshot.lost is then set too.
	corrupt *CorruptFile
	// nvidia describes the NVIDIA DRA driver checkpoint this load adopted.
	nvidia *NVIDIAAdoption
	// missing is set when Open found no checkpoint.json.
	missing bool
}

// load reads the adopt-pending marker and checkpoint.json; the caller holds
// the flock. It fails only on I/O errors: unreadable content is moved aside
// (after the marker is written) and yields an empty state.
func (s *Store) load() (loaded, error) {
	lost, err := s.readMarker()
	if err != nil {
		return loaded{}, err
	}
	l, err := s.loadFile(lost)
	if err != nil {
		return loaded{}, err
	}
	if l.lost == nil {
		// Unless loadFile just wrote the marker.
		l.lost = lost
	}
	if l.markerID, err = statPath(s.markerPath); err != nil {
		return loaded{}, fmt.Errorf("stat %s: %w", s.markerPath, err)
	}
	if l.lost != nil {
		// Nothing is written until the owner has adopted what the lost
		// file described.
		l.rewrite = false
	}
	return l, nil
}

// ErrDisappeared is the error of a CorruptFile (with no Path) when the
// checkpoint vanished under a running Store: deleted, or moved aside by
// an older plugin. Nothing was left to move aside.
var ErrDisappeared = errors.New("disappeared while in use")

// loadFile reads checkpoint.json. lost is the pending loss the marker
// records, if any: a file moved aside while there is none gets a marker
// first.
func (s *Store) loadFile(lost *lossRecord) (loaded, error) {
	f, fi, err := openRegular(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		l := loaded{snapshot: snapshot{state: claimstate.New(), id: fileID{missing: true}}, rewrite: true}
		if s.cur.id.known() && !s.cur.id.missing && s.cur.newer == nil && lost == nil {
			// The file this Store last read or wrote is gone, and no
			// Store removes one without the marker: someone deleted it,
			// or an older plugin moved it aside. Its claims are lost all
			// the same.
			reason := fmt.Errorf("%s %w", s.path, ErrDisappeared)
			l.lost = &lossRecord{BootID: s.bootID, Reason: reason.Error(), Since: s.now().UTC()}
			if err := s.writeMarker(l.lost); err != nil {
				return loaded{}, fmt.Errorf("%v: %w", reason, err)
			}
			l.corrupt = &CorruptFile{Err: reason}
		}
		if !s.cur.id.known() {
			l.missing = true
			if lost == nil {
				if err := s.lossIfEvidence(&l); err != nil {
					return loaded{}, err
				}
			}
		}
		return l, nil
	}
	var notRegular *notRegularError
	if errors.As(err, &notRegular) {
		// Nothing a writer leaves behind, not even a power loss: the path
		// was replaced, and whatever state it held is lost.
		return s.unreadable(fmt.Errorf("%s: %w", s.path, err), false, lost)
	}
	if err != nil {
		return loaded{}, fmt.Errorf("open %s: %w", s.path, err)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		_ = f.Close()
		return loaded{}, fmt.Errorf("read %s: %w", s.path, err)
	}
	l := loaded{snapshot: snapshot{id: statID(fi)}, pin: f}
	// With no fsync, a file of a previous boot may be torn; nor does every
	// NVIDIA file record its boot. The mtime tells: any file written in
	// this boot is younger than the boot.
	previousBoot := !s.bootTime.IsZero() && fi.ModTime().Before(s.bootTime)

	var d decoded
	if len(data) > maxFileSize {
		err = fmt.Errorf("larger than %d bytes", maxFileSize)
	} else {
		d, err = s.schema.decode(data)
	}
	var newer *newerVersionError
	switch {
	case errors.As(err, &newer):
		newer.path = s.path
		l.newer = newer
	case err != nil:
		_ = f.Close()
		return s.unreadable(err, previousBoot, lost)
	default:
		if !written(d.from) {
			l.migrated = d.from
		}
		if d.nvidia != nil {
			// The file is about to be replaced by gpudra's: keep NVIDIA's
			// as it was, for a rollback and for the record.
			kept, err := s.keepNVIDIA(data)
			if err != nil {
				_ = f.Close()
				return loaded{}, fmt.Errorf("keep NVIDIA DRA driver checkpoint %s before adopting it: %w", s.path, err)
			}
			l.nvidia = &NVIDIAAdoption{Format: d.from, KeptAt: kept, Claims: len(d.state.Claims),
				Started: d.nvidia.started, Skipped: d.nvidia.skipped}
			stampAdoption(d.state, s.now())
		}
		sameBoot := d.bootID == s.bootID
		if d.bootID == "" {
			sameBoot = !previousBoot
		}
		switch {
		case !sameBoot:
			l.bootReset, l.discardedClaims = true, len(d.state.Claims)
			l.state, l.rewrite = claimstate.New(), true
		case written(d.from) && d.poolFilled == 0:
			l.state, l.data = d.state, data
		default:
			l.state, l.rewrite, l.poolFilled = d.state, true, d.poolFilled
		}
	}
	return l, nil
}

// lossIfEvidence, for a checkpoint.json missing at Open with no loss
// pending, looks for start record files of this boot ([StartedDirName])
// and asks the WithLossEvidence function whether claims may be prepared on
// the node all the same; if so it writes the adopt-pending
// marker before anything else is written, and l records the loss.
func (s *Store) lossIfEvidence(l *loaded) error {
	var evidence []string
	if started := s.startedEvidence(); started != "" {
		evidence = append(evidence, started)
	}
	if s.lossEvidence != nil {
		found, err := s.lossEvidence()
		if err != nil {
			found = fmt.Sprintf("whether claims are prepared on this node cannot be told (%v)", err)
		}
		if found != "" {
			evidence = append(evidence, found)
		}
	}
	if len(evidence) == 0 {
		return nil
	}
	found := strings.Join(evidence, " and ")
	reason := fmt.Errorf("%s is missing but %s", s.path, found)
	l.lost = &lossRecord{BootID: s.bootID, Reason: reason.Error(), Since: s.now().UTC()}
	if err := s.writeMarker(l.lost); err != nil {
		return fmt.Errorf("%v: %w", reason, err)
	}
	l.corrupt = &CorruptFile{Err: reason}
	return nil
}

// unreadable moves checkpoint.json, which cannot be read for reason, aside.
// An unreadable file of a previous boot is a boot reset; one of this boot
// is a loss: unless one is pending already, the marker is written before
// the file is moved, so that no process ever finds the file gone without
// the marker.
func (s *Store) unreadable(reason error, previousBoot bool, lost *lossRecord) (loaded, error) {
	dst, err := s.asideName()
	if err == nil && !previousBoot && lost == nil {
		lost = &lossRecord{BootID: s.bootID, MovedTo: dst, Reason: reason.Error(), Since: s.now().UTC()}
		err = s.writeMarker(lost)
	}
	if err == nil {
		err = os.Rename(s.path, dst)
	}
	if err != nil {
		return loaded{}, fmt.Errorf("move unreadable %s aside (%v): %w", s.path, reason, err)
	}
	l := loaded{snapshot: snapshot{state: claimstate.New(), id: fileID{missing: true}}, rewrite: true}
	if previousBoot {
		l.bootReset, l.tornPath, l.tornErr = true, dst, reason
	} else {
		l.corrupt = &CorruptFile{Path: dst, Err: reason}
		l.lost = lost
	}
	return l, nil
}

// asideName returns a name of its own for moving checkpoint.json aside,
// never one of an earlier file.
func (s *Store) asideName() (string, error) {
	base := s.path + corruptInfix + s.now().UTC().Format("20060102T150405.000000000Z")
	dst := base
	for i := 1; ; i++ {
		_, err := os.Lstat(dst)
		if errors.Is(err, fs.ErrNotExist) {
			return dst, nil
		}
		if err != nil {
			return "", err
		}
		dst = fmt.Sprintf("%s-%d", base, i)
	}
}

// keepNVIDIA writes a copy of an NVIDIA DRA driver checkpoint next to
// checkpoint.json, under a name of its own, and returns its path. A copy,
// not a rename: until gpudra's file replaces it, checkpoint.json stays
// NVIDIA's, so a crash in between only makes the next Open adopt it again.
func (s *Store) keepNVIDIA(data []byte) (string, error) {
	base := s.path + nvidiaAsideInfix + s.now().UTC().Format("20060102T150405.000000000Z")
	dst := base
	for i := 1; ; i++ {
		f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, fs.ErrExist) {
			dst = fmt.Sprintf("%s-%d", base, i)
			continue
		}
		if err != nil {
			return "", err
		}
		_, err = f.Write(data)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(dst)
			return "", err
		}
		return dst, nil
	}
}

// notRegularError says what a path that should be a regular file is.
type notRegularError struct{ kind string }

func (e *notRegularError) Error() string { return "is a " + e.kind + ", not a regular file" }

// openRegular opens path for reading if it is a regular file (following
// symlinks), never blocking on a FIFO. Anything else there (a directory, a
// socket, a device, a symlink loop, a symlink to a missing file) gives a
// *notRegularError; a missing file gives fs.ErrNotExist.
func openRegular(path string) (*os.File, fs.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if fi, lerr := os.Lstat(path); lerr == nil && fi.Mode()&fs.ModeSymlink != 0 {
				// A link to nothing is no file gpudra wrote (it renames
				// regular files into place): the path was replaced.
				return nil, nil, &notRegularError{kind: "symbolic link to a missing file"}
			}
			return nil, nil, err
		}
		// A socket cannot be opened at all (ENXIO), nor a symlink loop.
		if fi, lerr := os.Lstat(path); lerr == nil && !fi.Mode().IsRegular() {
			return nil, nil, &notRegularError{kind: kindOf(fi.Mode())}
		}
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err == nil && !fi.Mode().IsRegular() {
		err = &notRegularError{kind: kindOf(fi.Mode())}
	}
	if err != nil {
		_ = f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

func kindOf(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	case m&fs.ModeNamedPipe != 0:
		return "named pipe"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device"
	}
	return "special file"
}

// removeStaleTemps deletes the temp files of the checkpoint and of the
// marker that a crashed writer left behind; the caller holds the flock, so
// no write is in progress.
func (s *Store) removeStaleTemps() {
	for _, path := range []string{s.path, s.markerPath} {
		removed, err := lockedfile.RemoveStaleTemps(path)
		if err != nil {
			s.logger.Error(err, "Cannot remove stale checkpoint temp files", "path", path)
		}
		if len(removed) > 0 {
			s.logger.Info("Removed stale checkpoint temp files", "files", removed)
		}
	}
}

func readBootID(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read boot ID: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", fmt.Errorf("read boot ID: %s is empty", path)
	}
	return id, nil
}

// readBootTime returns the btime of a /proc/stat file.
func readBootTime(path string) (time.Time, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return time.Time{}, fmt.Errorf("%s: btime: %w", path, err)
			}
			return time.Unix(n, 0), nil
		}
	}
	return time.Time{}, fmt.Errorf("%s: no btime line", path)
}
