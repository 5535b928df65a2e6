package checkpoint

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpudra/gpudra/internal/lockedfile"
	"github.com/gpudra/gpudra/pkg/claimstate"
)

// StartedDirName is the directory, in the data directory, that holds a copy
// of every start record whose preparation may have set something up: one
// file per claim, <claim UID>.json, in the checkpoint's format with that
// one claim. checkpoint.json alone is not enough: when it is lost while a
// preparation is half done (an MPS daemon started, a GPU instance created,
// a GPU bound to vfio-pci, but no CDI spec written yet), nothing else on
// the node names that setup, and adoption, which finds completed claims by
// their CDI specs, would leave it held by no one. A preparation keeps its
// file from its start record until it completes or is rolled back; see
// docs/design/checkpoint.md.
const StartedDirName = "started"

// startedSuffix ends the name of a start record's file.
const startedSuffix = ".json"

// unreadableSuffix is appended to a start record's file that cannot be
// read, when it is moved aside.
const unreadableSuffix = ".unreadable"

// startedPath is the file of the claim's start record, or an error if uid
// cannot be a file name.
func (s *Store) startedPath(uid string) (string, error) {
	if uid == "" || uid == "." || uid == ".." || strings.ContainsAny(uid, "/\x00") {
		return "", fmt.Errorf("claim UID %q cannot name a start record's file", uid)
	}
	return filepath.Join(filepath.Dir(s.path), StartedDirName, uid+startedSuffix), nil
}

// KeepStarted writes the start record c (a claim in phase PrepareStarted,
// already recorded in the checkpoint) to a file of its own, replacing the
// claim's earlier one. Call it before setting anything up: the file is
// what adoption finds the setup by if checkpoint.json is lost.
func (s *Store) KeepStarted(c *claimstate.Claim) error {
	if c.Phase != claimstate.PrepareStarted {
		return fmt.Errorf("keep the start record of claim %s: it is %s, not %s", c.UID, c.Phase, claimstate.PrepareStarted)
	}
	path, err := s.startedPath(c.UID)
	if err != nil {
		return err
	}
	st := &claimstate.State{Claims: map[string]*claimstate.Claim{c.UID: c}}
	if err := s.schema.validate(st); err != nil {
		return fmt.Errorf("keep the start record of claim %s: %w", c.UID, err)
	}
	data, err := encode(s.bootID, st)
	if err != nil {
		return fmt.Errorf("keep the start record of claim %s: %w", c.UID, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("keep the start record of claim %s: %w", c.UID, err)
	}
	if err := lockedfile.Write(path, data); err != nil {
		return fmt.Errorf("keep the start record of claim %s: %w", c.UID, err)
	}
	return nil
}

// DropStarted removes the claim's start record file, once what it names
// is recorded as completed or undone. Dropping a file that does not exist
// succeeds.
func (s *Store) DropStarted(uid string) error {
	path, err := s.startedPath(uid)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("drop the start record file of claim %s: %w", uid, err)
	}
	return nil
}

// StartedFiles is what [Store.Started] found.
type StartedFiles struct {
	// Claims are the start records of this boot, by claim UID.
	Claims map[string]*claimstate.Claim
	// Unreadable are the files that could not be read. One whose content
	// is damaged was moved aside (Path says where); one written by a newer
	// plugin (a later schema, or records this plugin does not know) is
	// left in place for that plugin.
	Unreadable []CorruptFile
}

// Started reads the start record files. Those of an earlier boot are
// removed: a reboot reset what they named. It fails only if the directory
// cannot be listed.
func (s *Store) Started() (StartedFiles, error) {
	out := StartedFiles{Claims: map[string]*claimstate.Claim{}}
	dir := filepath.Join(filepath.Dir(s.path), StartedDirName)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("list the start record files in %s: %w", dir, err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, startedSuffix) {
			// Temp files of a killed write, files moved aside.
			continue
		}
		uid := strings.TrimSuffix(name, startedSuffix)
		path := filepath.Join(dir, name)
		c, readErr := s.readStarted(path, uid)
		var newer *newerVersionError
		switch {
		case errors.As(readErr, &newer):
			out.Unreadable = append(out.Unreadable, CorruptFile{Path: path, Err: readErr})
		case readErr != nil:
			aside := path + unreadableSuffix
			if err := os.Rename(path, aside); err != nil {
				aside = path
				readErr = errors.Join(readErr, fmt.Errorf("move it aside: %w", err))
			}
			out.Unreadable = append(out.Unreadable, CorruptFile{Path: aside, Err: readErr})
		case c != nil:
			out.Claims[uid] = c
		}
	}
	return out, nil
}

// readStarted reads one start record file: nil, nil for one of an earlier
// boot, which it removes.
func (s *Store) readStarted(path, uid string) (*claimstate.Claim, error) {
	d, err := s.schema.decodeFile(path)
	if err != nil {
		return nil, err
	}
	if d.nvidia != nil {
		return nil, errors.New("holds NVIDIA's DRA driver's checkpoint, not a start record")
	}
	if d.bootID != s.bootID {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("of an earlier boot, and cannot be removed: %w", err)
		}
		return nil, nil
	}
	c := d.state.Claims[uid]
	if c == nil || len(d.state.Claims) != 1 {
		return nil, fmt.Errorf("holds claims %v, not claim %s alone", slices.Sorted(maps.Keys(d.state.Claims)), uid)
	}
	if c.Phase != claimstate.PrepareStarted {
		return nil, fmt.Errorf("claim %s is %s, not %s", uid, c.Phase, claimstate.PrepareStarted)
	}
	return c, nil
}

// startedEvidence describes the start record files of this boot, for a
// checkpoint.json found missing: "" when there are none.
func (s *Store) startedEvidence() string {
	found, err := s.Started()
	if err != nil {
		return fmt.Sprintf("whether preparations were in progress cannot be told (%v)", err)
	}
	if n := len(found.Claims) + len(found.Unreadable); n > 0 {
		return fmt.Sprintf("start record files of preparations in progress are in %s (%d)", filepath.Join(filepath.Dir(s.path), StartedDirName), n)
	}
	return ""
}
