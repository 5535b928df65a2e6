package lockedfile

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// tempInfix marks the temp files of Write: <name>.tmp-<random>.
const tempInfix = ".tmp-"

// Write replaces the file at path with data: write a temp file (mode
// 0600) in the same directory, stat it, rename it over path. Readers see the old content or the new, never a mix,
// and a process crash at any point leaves one of the two (plus, at worst, a
// stale temp file). It does not fsync: after a power loss the file may be
// empty or torn (docs/design/checkpoint.md says why the checkpoint accepts that).
func Write(path string, data []byte) error {
	f, _, err := Replace(path, data)
	if f != nil {
		_ = f.Close()
	}
	return err
}

// RemoveStaleTemps removes the temp files that Write calls for
// path left behind when their process was killed (<path>.tmp-<random>),
// and returns the ones it removed. The caller must hold whatever lock
// serialises the writers of path: a live writer's temp file looks the same.
// Every file written with Write should be cleaned this way at start.
func RemoveStaleTemps(path string) ([]string, error) {
	dir, prefix := filepath.Dir(path), filepath.Base(path)+tempInfix
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list %s for stale temp files: %w", dir, err)
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove stale temp file: %w", err))
			continue
		}
		removed = append(removed, p)
	}
	return removed, errors.Join(errs...)
}

// Replace is Write handing back the new file, still open, and its
// stat(2): a rename keeps the inode, size and mtime, so the temp file's
// stat is the new file's, and a caller (the checkpoint) pins the file
// without opening it again. The caller closes the file.
//
// It calls the system directly rather than through os.File: for a regular
// file, os.OpenFile spends five more system calls trying to register it
// with the network poller, and os.Rename an lstat of the destination,
// a third of the calls of a whole replace.
func Replace(path string, data []byte) (io.Closer, unix.Stat_t, error) {
	var st unix.Stat_t
	fd, tmp, err := createTemp(path)
	if err != nil {
		return nil, st, fmt.Errorf("write %s: %w", path, err)
	}
	err = writeAll(fd, data)
	if err == nil {
		err = RetryEINTR(func() error { return unix.Fstat(fd, &st) })
	}
	if err == nil {
		err = RetryEINTR(func() error { return unix.Rename(tmp, path) })
	}
	if err != nil {
		_ = unix.Close(fd)
		_ = unix.Unlink(tmp)
		return nil, st, fmt.Errorf("write %s: %w", path, err)
	}
	return rawFile(fd), st, nil
}

// createTemp creates path's temp file, <path>.tmp-<random>, mode 0600,
// as os.CreateTemp would.
func createTemp(path string) (fd int, name string, err error) {
	prefix := path + tempInfix
	for range 10000 {
		name = prefix + strconv.FormatUint(uint64(rand.Uint32()), 10)
		err = RetryEINTR(func() error {
			var oerr error
			fd, oerr = unix.Open(name, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC, 0o600)
			return oerr
		})
		if !errors.Is(err, unix.EEXIST) {
			break
		}
	}
	if err != nil {
		return -1, "", fmt.Errorf("create temp file in %s: %w", filepath.Dir(path), err)
	}
	return fd, name, nil
}

func writeAll(fd int, data []byte) error {
	for len(data) > 0 {
		n, err := unix.Write(fd, data)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

// RetryEINTR calls fn again while a signal interrupts it.
func RetryEINTR(fn func() error) error {
	for {
		if err := fn(); !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// rawFile is an open file descriptor, closed once by Close.
type rawFile int

// Close implements [io.Closer].
func (f rawFile) Close() error { return unix.Close(int(f)) }
