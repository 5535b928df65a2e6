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
	"strings"
	"time"

	"golang.org/x/sys/unix"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Writer writes and removes the per-claim spec files in one CDI directory.
// It is safe for concurrent use: every claim has its own file, and each file
// is replaced atomically (temp file, rename).
type Writer struct {
	dir        string
	driverName string
	// staging is this driver's private subdirectory of dir, where specs
	// are written and validated before they are renamed into dir; stage
	// is the CDI library's cache over it.
	staging string
	stage   *cdiapi.Cache
}

// NewWriter returns a writer for dir (usually /var/run/cdi), creating it if
// needed.
func NewWriter(dir, driverName string) (*Writer, error) {
	staging := filepath.Join(dir, "."+Vendor(driverName)+".staging")
	if err := os.MkdirAll(staging, 0o755); err != nil {
		return nil, fmt.Errorf("create CDI spec directory: %w", err)
	}
	// No auto-refresh: the cache only writes, it never resolves devices.
	stage, err := cdiapi.NewCache(cdiapi.WithSpecDirs(staging), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI cache for %s: %w", staging, err)
	}
	return &Writer{dir: dir, driverName: driverName, staging: staging, stage: stage}, nil
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

// tempInfix marks the temp files of an earlier Write: <spec file>.tmp-<random>.
// The name does not end in .json or .yaml, so the CDI library (and every
// runtime using it) skips it.
const tempInfix = ".tmp-"

// Write validates spec and replaces the claim's spec file with it.
//
// The CDI library's Cache.WriteSpec validates the spec in memory and
// writes it atomically, but its temp file is named spec.<random>.tmp
// whatever the vendor: a crash between creating and renaming it would
// leave a file nobody can attribute. So the library writes into this
// driver's own staging subdirectory (runtimes do not look into
// subdirectories), and the finished file is renamed into place:
// everything a killed Write leaves is in the staging directory, which
// [Writer.RemoveStaleTemps] empties.
//
// That is two renames where one would do, but one rename needs the temp
// file named by this writer, so the spec would have to be validated
// without the library writing it: the library (v1.1.1, and v1.1.2)
// validates a spec in memory only inside Cache.WriteSpec. Most of its
// checks are exported (specs-go's ValidateVersion, pkg/parser's name
// checks, ContainerEdits.Validate), but not the rules that a device has
// edits, that names are unique and that a spec has a device, so
// validating apart from it means a second parse of the written file
// (which doubled the cost of 32 concurrent prepares) or a copy of those
// rules. The second rename, rename(2) on the tmpfs of /var/run/cdi, costs
// about 4 us of CPU; the library's write around it (its stat of the
// directory, temp file and renameat2) about 30 us, twice a plain atomic
// replace of the same bytes (docs/performance.md).
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
	// The staging directory, or the whole CDI directory, goes when someone
	// cleans it (a tmpfs remounted, an operator's cleanup): WriteSpec
	// creates it again (os.MkdirAll of the spec's directory), as at start,
	// rather than fail every prepare until a restart.
	if err := w.stage.WriteSpec(spec, name); err != nil {
		return fmt.Errorf("invalid CDI spec: %w", err)
	}
	staged, final := filepath.Join(w.staging, name), filepath.Join(w.dir, name)
	// rename(2) itself: os.Rename first stats the destination, to report a
	// directory there with an error of its own, which rename(2) reports
	// too (EISDIR).
	err := unix.Rename(staged, final)
	for errors.Is(err, unix.EINTR) {
		err = unix.Rename(staged, final)
	}
	if err != nil {
		_ = os.Remove(staged)
		return fmt.Errorf("rename %s to %s: %w", staged, final, err)
	}
	return nil
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
		// A name with no UID is no spec Write made (claims have UIDs), and
		// a claim with an empty UID cannot be recorded.
		if uid := strings.TrimSuffix(strings.TrimPrefix(name, prefix), ".json"); uid != "" {
			uids = append(uids, uid)
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
