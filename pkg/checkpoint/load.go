package checkpoint

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

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

func statPath(path string) (fileID, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fileID{missing: true}, nil
	}
	if err != nil {
		return fileID{}, err
	}
	return statID(fi), nil
}

// loaded is what load found on disk and made of it.
type loaded struct {
	snapshot
	// pin is the open file of snapshot.id, when there is one.
	pin *os.File
	// data is the file content when it holds snapshot.state in the current
	// version, so that an unchanged state is not written again.
	data []byte
	// rewrite is set when the file does not hold snapshot.state in the
	// current version: Open then writes it at once.
	rewrite bool

	migrated  string
	bootReset bool
	// discardedClaims counts the claims of a previous boot dropped.
	discardedClaims int
	// tornPath and tornErr describe an unreadable file of a previous boot,
	// moved aside quietly.
	tornPath string
	tornErr  error
	corrupt  *CorruptFile
}

// load reads checkpoint.json; the caller holds the flock. It fails only on
// I/O errors: unreadable content is moved aside and yields an empty state.
func (s *Store) load() (loaded, error) {
	f, err := os.Open(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return loaded{snapshot: snapshot{state: claimstate.New(), id: fileID{missing: true}}, rewrite: true}, nil
	}
	if err != nil {
		return loaded{}, fmt.Errorf("open %s: %w", s.path, err)
	}
	fi, err := f.Stat()
	var data []byte
	if err == nil {
		data, err = io.ReadAll(io.LimitReader(f, maxFileSize+1))
	}
	if err != nil {
		_ = f.Close()
		return loaded{}, fmt.Errorf("read %s: %w", s.path, err)
	}
	l := loaded{snapshot: snapshot{id: statID(fi)}, pin: f}
	// With no fsync, a file of a previous boot may be torn; nor does v1
	// record its boot. The mtime tells: any file written in this boot is
	// younger than the boot.
	previousBoot := !s.bootTime.IsZero() && fi.ModTime().Before(s.bootTime)

	var d decoded
	if len(data) > maxFileSize {
		err = fmt.Errorf("larger than %d bytes", maxFileSize)
	} else {
		d, err = decode(data)
	}
	var newer *newerVersionError
	switch {
	case errors.As(err, &newer):
		l.newer = newer.version
	case err != nil:
		_ = f.Close()
		dst, merr := s.moveAside()
		if merr != nil {
			return loaded{}, fmt.Errorf("move unreadable %s aside (%v): %w", s.path, err, merr)
		}
		l = loaded{snapshot: snapshot{state: claimstate.New(), id: fileID{missing: true}}, rewrite: true}
		if previousBoot {
			l.bootReset, l.tornPath, l.tornErr = true, dst, err
		} else {
			l.corrupt = &CorruptFile{Path: dst, Err: err}
		}
	default:
		if !written(d.from) {
			l.migrated = d.from
		}
		sameBoot := d.bootID == s.bootID
		if d.bootID == "" {
			sameBoot = !previousBoot
		}
		switch {
		case !sameBoot:
			l.bootReset, l.discardedClaims = true, len(d.state.Claims)
			l.state, l.rewrite = claimstate.New(), true
		case written(d.from):
			l.state, l.data = d.state, data
		default:
			l.state, l.rewrite = d.state, true
		}
	}
	return l, nil
}

// moveAside renames checkpoint.json to a name of its own, never replacing
// an earlier one.
func (s *Store) moveAside() (string, error) {
	base := s.path + corruptInfix + s.now().UTC().Format("20060102T150405.000000000Z")
	dst := base
	for i := 1; ; i++ {
		_, err := os.Lstat(dst)
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err != nil {
			return "", err
		}
		dst = fmt.Sprintf("%s-%d", base, i)
	}
	return dst, os.Rename(s.path, dst)
}

// removeStaleTemps deletes temp files that a crashed writer left behind;
// the caller holds the flock, so no write is in progress.
func (s *Store) removeStaleTemps() {
	dir, prefix := filepath.Dir(s.path), filepath.Base(s.path)+tempInfix
	entries, err := os.ReadDir(dir)
	if err != nil {
		s.logger.Error(err, "Cannot list checkpoint directory for stale temp files", "dir", dir)
		return
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if err := os.Remove(p); err != nil {
			s.logger.Error(err, "Cannot remove stale checkpoint temp file", "path", p)
		} else {
			s.logger.Info("Removed stale checkpoint temp file", "path", p)
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
