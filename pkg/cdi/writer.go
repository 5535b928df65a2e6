package cdi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/internal/lockedfile"
)

// Writer writes and removes the per-claim spec files in one CDI directory.
// It is safe for concurrent use: every claim has its own file, and each file
// is replaced atomically (temp file, rename).
type Writer struct {
	dir        string
	driverName string
	// staging is the subdirectory of dir where gpudra before 2026-11-28
	// wrote specs through the CDI library before renaming them into dir;
	// [Writer.RemoveStaleTemps] empties and removes what such a version
	// left.
	staging string
}

// NewWriter returns a writer for dir (usually /var/run/cdi), creating it if
// needed.
func NewWriter(dir, driverName string) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create CDI spec directory: %w", err)
	}
	return &Writer{dir: dir, driverName: driverName, staging: filepath.Join(dir, "."+Vendor(driverName)+".staging")}, nil
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

// tempInfix marks the temp files of a Write: <spec file>.tmp-<random>
// (lockedfile.Write's names). The name does not end in .json or
// .yaml, so the CDI library (and every runtime using it) skips it, and it
// names the claim, so [Writer.RemoveStaleTemps] knows it for this
// driver's.
const tempInfix = ".tmp-"

// Write validates spec and replaces the claim's spec file with it.
//
// The spec is checked as the CDI library checks one it writes (validate),
// encoded as the library encodes it (encoding/json) and replaced as the
// checkpoint is (lockedfile.Write: a temp file named after the
// spec, then rename(2)). Writing through the library's Cache.WriteSpec
// cost twice that: its temp file carries no vendor (spec.<random>.tmp,
// which a crash leaves unattributable, so it had to be written into a
// staging subdirectory and renamed a second time), it goes through
// os.File, and it opens the directory for every rename
// (docs/design/performance.md).
func (w *Writer) Write(claimUID string, spec *cdispec.Spec) error {
	if err := w.write(claimUID, spec); err != nil {
		return fmt.Errorf("write CDI spec for claim %s: %w", claimUID, err)
	}
	return nil
}

// WriteDevices validates spec, the device-plugin mode's node-wide spec of
// class [DeviceClass], and replaces its file, [Writer.DevicesPath].
func (w *Writer) WriteDevices(spec *cdispec.Spec) error {
	if err := w.writeFile(filepath.Base(w.DevicesPath()), spec); err != nil {
		return fmt.Errorf("write CDI spec of the device plugin's devices: %w", err)
	}
	return nil
}

// DevicesPath is the file of the device-plugin mode's spec.
func (w *Writer) DevicesPath() string {
	return filepath.Join(w.dir, Vendor(w.driverName)+"-"+DeviceClass+".json")
}

func (w *Writer) write(claimUID string, spec *cdispec.Spec) error {
	return w.writeFile(w.specName(claimUID)+".json", spec)
}

func (w *Writer) writeFile(name string, spec *cdispec.Spec) error {
	if err := validate(spec); err != nil {
		return fmt.Errorf("invalid CDI spec: %w", err)
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("encode CDI spec: %w", err)
	}
	path := filepath.Join(w.dir, name)
	err = lockedfile.Write(path, data)
	if errors.Is(err, fs.ErrNotExist) {
		// The directory goes when someone cleans it (a tmpfs remounted,
		// an operator's cleanup): create it again, as at start, rather
		// than fail every prepare until a restart.
		if err := os.MkdirAll(w.dir, 0o755); err != nil {
			return fmt.Errorf("create CDI spec directory: %w", err)
		}
		err = lockedfile.Write(path, data)
	}
	return err
}

// libraryTemp matches the temp files of the CDI library's spec writer
// (os.CreateTemp(dir, "spec.*.tmp") in tags.cncf.io/container-device-interface
// v1.1.1), which Write left in the CDI directory itself before it wrote
// through the staging directory.
var libraryTemp = regexp.MustCompile(`^spec\.[0-9]+\.tmp$`)

// maxSpecSize bounds what RemoveStaleTemps reads of a library temp file to
// attribute it; a larger file is nobody's claim spec, so not ours.
const maxSpecSize = 4 << 20

// RemoveStaleTemps removes the temp files that writes of this driver's
// specs left in the directory when the process was killed between creating
// a temp file and renaming it into place, and returns their paths. Other
// vendors' specs and temp files are left alone. It is idempotent and keeps
// going past a file it cannot remove, returning every such error joined.
//
// Call it at start, before the first Write: a temp file of a Write in
// progress (in this process or another instance of the driver) would be
// removed, and that Write would fail.
//
// A temp file is this driver's when:
//   - its name is that of a claim spec of this driver followed by
//     ".tmp-<random>" (what Write creates), or
//   - it is in the staging subdirectory (.k8s.<driver>.staging), where
//     versions before 2026-11-28 wrote through the library; the emptied
//     subdirectory is removed too, or
//   - its name is the CDI library's spec.<random>.tmp and its content is a
//     CDI spec of this driver's kind (k8s.<driver>/claim): the library's
//     names carry no vendor, and only this driver writes specs of its kind.
//     Such files were left by versions of Write that used the library.
//
// An empty, truncated or unparsable spec.<random>.tmp cannot be attributed
// and is left alone: it may be another vendor's write in progress, which
// removing it would break.
func (w *Writer) RemoveStaleTemps() ([]string, error) {
	entries, err := os.ReadDir(w.dir)
	if err != nil {
		return nil, fmt.Errorf("list CDI spec directory %s for stale temp files: %w", w.dir, err)
	}
	prefix := w.specName("")
	var removed []string
	var errs []error
	// Everything in the staging directory is a Write that did not finish.
	staged, err := os.ReadDir(w.staging)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("list CDI staging directory: %w", err))
	}
	for _, e := range staged {
		if !e.Type().IsRegular() {
			continue
		}
		path := filepath.Join(w.staging, e.Name())
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove stale CDI temp file: %w", err))
			continue
		}
		removed = append(removed, path)
	}
	if err == nil {
		// Writes no longer stage; something else left in the directory
		// keeps it, and says so.
		if err := os.Remove(w.staging); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove the CDI staging directory of an earlier version: %w", err))
		}
	}
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() {
			continue
		}
		path := filepath.Join(w.dir, name)
		switch {
		case strings.HasPrefix(name, prefix) && strings.Contains(name, ".json"+tempInfix):
		case libraryTemp.MatchString(name):
			ours, err := w.holdsOurSpec(path)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if !ours {
				continue
			}
		default:
			continue
		}
		if err := os.Remove(path); err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("remove stale CDI temp file: %w", err))
			}
			continue
		}
		removed = append(removed, path)
	}
	return removed, errors.Join(errs...)
}

// holdsOurSpec reports whether the file at path is a complete CDI spec of
// this driver's kind. A file that vanished is not.
func (w *Writer) holdsOurSpec(path string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read CDI temp file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxSpecSize+1))
	if err != nil {
		return false, fmt.Errorf("read CDI temp file %s: %w", path, err)
	}
	if len(data) > maxSpecSize {
		return false, nil
	}
	var spec struct {
		Kind string `json:"kind"`
	}
	if json.Unmarshal(data, &spec) != nil {
		return false, nil
	}
	return spec.Kind == Kind(w.driverName), nil
}

// NVIDIAPath returns the file NVIDIA's DRA driver writes a claim's spec to:
// the same transient spec name, in YAML. A claim adopted from that driver's
// checkpoint keeps it: it defines the CDI device IDs the kubelet holds, and
// a spec of gpudra's beside it would define the same devices twice, which
// the CDI library refuses.
func (w *Writer) NVIDIAPath(claimUID string) string {
	return filepath.Join(w.dir, w.specName(claimUID)+".yaml")
}

// Exists reports whether the claim's spec file is there: gpudra's, or the
// one NVIDIA's DRA driver wrote for a claim gpudra adopted from it.
func (w *Writer) Exists(claimUID string) bool {
	for _, p := range []string{w.Path(claimUID), w.NVIDIAPath(claimUID)} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// Remove deletes the claim's spec file, and the one NVIDIA's DRA driver
// wrote for it if there is one; a missing file is not an error.
func (w *Writer) Remove(claimUID string) error {
	for _, p := range []string{w.Path(claimUID), w.NVIDIAPath(claimUID)} {
		err := os.Remove(p)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove CDI spec for claim %s: %w", claimUID, err)
		}
	}
	return nil
}

// ClaimUIDs lists the claims that have a spec file written by this driver.
func (w *Writer) ClaimUIDs() ([]string, error) {
	return w.claimUIDs(".json")
}

// PreparedClaimUIDs lists the claims that have a spec file on the node:
// this driver's, or the YAML one NVIDIA's DRA driver wrote, for a claim
// it prepared before gpudra replaced it. Each is listed once, sorted.
// [Writer.Read] reads either. Adoption after a lost checkpoint lists them
// all: each may belong to a running pod, whichever driver prepared it.
func (w *Writer) PreparedClaimUIDs() ([]string, error) {
	uids, err := w.claimUIDs(".json", ".yaml")
	if err != nil {
		return nil, err
	}
	slices.Sort(uids)
	return slices.Compact(uids), nil
}

// claimUIDs lists the claims with a spec file of this driver's name and
// one of the extensions.
func (w *Writer) claimUIDs(exts ...string) ([]string, error) {
	entries, err := os.ReadDir(w.dir)
	if err != nil {
		return nil, fmt.Errorf("list CDI spec directory %s: %w", w.dir, err)
	}
	prefix := w.specName("")
	var uids []string
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasPrefix(name, prefix) {
			continue
		}
		for _, ext := range exts {
			// A name with no UID is no spec Write made (claims have
			// UIDs), and a claim with an empty UID cannot be recorded.
			if uid, ok := strings.CutSuffix(strings.TrimPrefix(name, prefix), ext); ok && uid != "" {
				uids = append(uids, uid)
			}
		}
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
