package vfio

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// FS is the part of sysfs the binder uses. Names are slash-separated and
// relative to the sysfs root ("bus/pci/devices/0000:1b:00.0/driver"). Errors
// are *fs.PathError values carrying the kernel's errno, so callers can test
// them with errors.Is (fs.ErrNotExist, syscall.EBUSY).
//
// Two implementations exist: [Dir], the real sysfs, and the fake in package
// fakesysfs, which models what the kernel does on each write.
type FS interface {
	// ReadFile returns the content of a sysfs attribute.
	ReadFile(name string) ([]byte, error)
	// WriteFile writes data to a sysfs attribute in one write call, as the
	// kernel expects of sysfs stores. It never creates a file.
	WriteFile(name string, data []byte) error
	// Readlink returns the target of a symbolic link.
	Readlink(name string) (string, error)
	// ReadDir returns the names in a directory, sorted.
	ReadDir(name string) ([]string, error)
	// Exists reports whether name exists, following links; an error other
	// than "does not exist" is returned as is.
	Exists(name string) (bool, error)
}

// Dir implements [FS] on the sysfs mounted at a directory, normally "/sys"
// (the kubelet plugin's --sysfs-root).
type Dir string

// DefaultSysfsRoot is where sysfs is mounted on a host.
const DefaultSysfsRoot = "/sys"

func (d Dir) path(name string) string {
	return filepath.Join(string(d), filepath.FromSlash(name))
}

// ReadFile implements [FS].
func (d Dir) ReadFile(name string) ([]byte, error) { return os.ReadFile(d.path(name)) }

// WriteFile implements [FS]. Unlike os.WriteFile it neither creates nor
// truncates: a sysfs attribute that does not exist is an error, and the
// whole value goes to the kernel in a single write.
func (d Dir) WriteFile(name string, data []byte) error {
	f, err := os.OpenFile(d.path(name), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Readlink implements [FS].
func (d Dir) Readlink(name string) (string, error) { return os.Readlink(d.path(name)) }

// ReadDir implements [FS].
func (d Dir) ReadDir(name string) ([]string, error) {
	entries, err := os.ReadDir(d.path(name))
	if err != nil {
		return nil, err
	}
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names, nil
}

// Exists implements [FS].
func (d Dir) Exists(name string) (bool, error) {
	_, err := os.Stat(d.path(name))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	default:
		return false, err
	}
}

// readAttr reads a sysfs attribute and trims the trailing newline.
func readAttr(fsys FS, name string) (string, error) {
	data, err := fsys.ReadFile(name)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(data)), nil
}

// linkBase returns the last element of the target of the link name, or ""
// when there is no such link.
func linkBase(fsys FS, name string) (string, error) {
	target, err := fsys.Readlink(name)
	switch {
	case err == nil:
		return path.Base(filepath.ToSlash(target)), nil
	case errors.Is(err, fs.ErrNotExist):
		return "", nil
	default:
		return "", err
	}
}

// readDevNumber parses a sysfs "dev" attribute, "MAJ:MIN".
func readDevNumber(fsys FS, name string) (major, minor int64, err error) {
	s, err := readAttr(fsys, name)
	if err != nil {
		return 0, 0, err
	}
	if _, err := fmt.Sscanf(s, "%d:%d", &major, &minor); err != nil || major < 0 || minor < 0 ||
		s != fmt.Sprintf("%d:%d", major, minor) {
		return 0, 0, fmt.Errorf("%s: want \"<major>:<minor>\", got %q", name, s)
	}
	return major, minor, nil
}
