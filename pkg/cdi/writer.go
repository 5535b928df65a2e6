package cdi

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Writer writes and removes the per-claim spec files in one CDI directory.
// It is safe for concurrent use: every claim has its own file, and each file
// is replaced atomically by the CDI library (temp file, rename).
type Writer struct {
	dir        string
	driverName string
	cache      *cdiapi.Cache
}

// NewWriter returns a writer for dir (usually /var/run/cdi), creating it if
// needed.
func NewWriter(dir, driverName string) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create CDI spec directory: %w", err)
	}
	// No auto-refresh: gpudra only writes through the cache, it never
	// resolves devices with it, so watching the directory would be waste.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI cache for %s: %w", dir, err)
	}
	return &Writer{dir: dir, driverName: driverName, cache: cache}, nil
}

// Dir is the directory the writer writes to.
func (w *Writer) Dir() string { return w.dir }

// specName is the transient spec name of a claim, without extension.
func (w *Writer) specName(claimUID string) string {
	return cdiapi.GenerateTransientSpecName(Vendor(w.driverName), Class, claimUID)
}

// Path returns the file a claim's spec is written to.
func (w *Writer) Path(claimUID string) string {
	return filepath.Join(w.dir, w.specName(claimUID)+".json")
}

// Write validates spec and replaces the claim's spec file with it.
func (w *Writer) Write(claimUID string, spec *cdispec.Spec) error {
	if err := w.cache.WriteSpec(spec, w.specName(claimUID)+".json"); err != nil {
		return fmt.Errorf("write CDI spec for claim %s: %w", claimUID, err)
	}
	return nil
}

// Exists reports whether the claim's spec file is there.
func (w *Writer) Exists(claimUID string) bool {
	_, err := os.Stat(w.Path(claimUID))
	return err == nil
}

// Remove deletes the claim's spec file; a missing file is not an error.
func (w *Writer) Remove(claimUID string) error {
	err := os.Remove(w.Path(claimUID))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove CDI spec for claim %s: %w", claimUID, err)
	}
	return nil
}

// ClaimUIDs lists the claims that have a spec file written by this driver.
func (w *Writer) ClaimUIDs() ([]string, error) {
	entries, err := os.ReadDir(w.dir)
	if err != nil {
		return nil, fmt.Errorf("list CDI spec directory %s: %w", w.dir, err)
	}
	prefix := w.specName("")
	var uids []string
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasPrefix(name, prefix) || !strings.HasSuffix(name, ".json") {
			continue
		}
		uids = append(uids, strings.TrimSuffix(strings.TrimPrefix(name, prefix), ".json"))
	}
	return uids, nil
}

// RemoveIfOlder removes the claim's spec file if it was last written
// before cutoff, and reports whether it did.
func (w *Writer) RemoveIfOlder(claimUID string, cutoff time.Time) (bool, error) {
	fi, err := os.Stat(w.Path(claimUID))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("stat CDI spec for claim %s: %w", claimUID, err)
	}
	if !fi.ModTime().Before(cutoff) {
		return false, nil
	}
	return true, w.Remove(claimUID)
}

// DeviceNames returns the names of the devices in a claim's spec, as the
// device model names them: the CDI device names without the "<uid>-"
// prefix.
func (w *Writer) DeviceNames(claimUID string) ([]string, error) {
	data, err := os.ReadFile(w.Path(claimUID))
	if err != nil {
		return nil, fmt.Errorf("read CDI spec for claim %s: %w", claimUID, err)
	}
	spec, err := cdiapi.ParseSpec(data)
	if err != nil {
		return nil, fmt.Errorf("parse CDI spec for claim %s: %w", claimUID, err)
	}
	prefix := DeviceName(claimUID, "")
	names := make([]string, 0, len(spec.Devices))
	for _, d := range spec.Devices {
		if name, ok := strings.CutPrefix(d.Name, prefix); ok && name != "" {
			names = append(names, name)
		}
	}
	return names, nil
}
