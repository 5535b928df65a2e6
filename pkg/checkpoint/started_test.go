package checkpoint

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

func startedClaim(uid string) *claimstate.Claim {
	c := withRecords(testClaim(uid), "example", `{"daemon":"mps-`+uid+`"}`)
	c.Phase = claimstate.PrepareStarted
	return c
}

// A start record file reads back as the claim it was written from, and is
// gone once dropped; dropping it twice succeeds.
func TestStartedRoundTrip(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	want := startedClaim("a")
	if err := s.KeepStarted(want); err != nil {
		t.Fatal(err)
	}
	found, err := s.Started()
	if err != nil || len(found.Unreadable) != 0 {
		t.Fatalf("Started: %v, unreadable %v", err, found.Unreadable)
	}
	if got := found.Claims["a"]; !reflect.DeepEqual(got, want) {
		t.Errorf("read back\n%s\nwant\n%s", dump(&claimstate.State{Claims: found.Claims}), dump(&claimstate.State{Claims: map[string]*claimstate.Claim{"a": want}}))
	}
	for range 2 {
		if err := s.DropStarted("a"); err != nil {
			t.Fatal(err)
		}
	}
	if found, err := s.Started(); err != nil || len(found.Claims) != 0 {
		t.Errorf("after DropStarted: %v, %v; want none", found.Claims, err)
	}
}

// KeepStarted refuses what is not a start record, a UID that is no file
// name, and records the Store does not know.
func TestKeepStartedRefuses(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	completed := testClaim("a")
	unknown := withRecords(startedClaim("b"), "from-the-future", `{}`)
	for name, c := range map[string]*claimstate.Claim{"completed": completed, "slash": startedClaim("../x"), "unknown record": unknown} {
		if err := s.KeepStarted(c); err == nil {
			t.Errorf("%s: KeepStarted succeeded", name)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(e.dir, StartedDirName)); len(entries) != 0 {
		t.Errorf("files written: %v", entries)
	}
}

// Files of an earlier boot are removed (the reboot reset what they name);
// a damaged one is moved aside and reported; one of a newer plugin stays.
func TestStartedSortsFiles(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	if err := s.KeepStarted(startedClaim("old")); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()
	e.setBootID(t, "boot-b")
	s, _ = e.open(t)
	if err := s.KeepStarted(startedClaim("now")); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(e.dir, StartedDirName)
	writeFile(t, filepath.Join(dir, "torn.json"), `{"version":"v5","bootID":"boot-b","claims":{"torn":`)
	writeFile(t, filepath.Join(dir, "newer.json"), `{"version":"v99","bootID":"boot-b"}`)
	found, err := s.Started()
	if err != nil {
		t.Fatal(err)
	}
	if len(found.Claims) != 1 || found.Claims["now"] == nil {
		t.Errorf("claims %v, want only this boot's", found.Claims)
	}
	var paths []string
	for _, f := range found.Unreadable {
		paths = append(paths, filepath.Base(f.Path))
	}
	if want := []string{"newer.json", "torn.json" + unreadableSuffix}; !reflect.DeepEqual(paths, want) {
		t.Errorf("unreadable %v, want %v", paths, want)
	}
	for name, want := range map[string]bool{"old.json": false, "now.json": true, "newer.json": true, "torn.json": false, "torn.json" + unreadableSuffix: true} {
		if _, err := os.Stat(filepath.Join(dir, name)); (err == nil) != want {
			t.Errorf("%s exists: %v, want %v", name, err == nil, want)
		}
	}
}

// A checkpoint.json missing next to a start record file of this boot is a
// loss even without WithLossEvidence: the preparation may have set up
// something only the lost file recorded. One of an earlier boot is not.
func TestMissingFileWithStartRecordNeedsAdoption(t *testing.T) {
	for _, boot := range []string{"boot-a", "boot-b"} {
		t.Run(boot, func(t *testing.T) {
			e := newTestEnv(t)
			s, _ := e.open(t)
			if err := s.KeepStarted(startedClaim("a")); err != nil {
				t.Fatal(err)
			}
			_ = s.Close()
			if err := os.Remove(e.path()); err != nil {
				t.Fatal(err)
			}
			e.setBootID(t, boot)
			s, report := e.open(t)
			wantLoss := boot == "boot-a"
			if s.NeedsAdoption() != wantLoss || (report.Corrupt != nil) != wantLoss {
				t.Fatalf("NeedsAdoption = %v, Corrupt = %+v; want a loss: %v", s.NeedsAdoption(), report.Corrupt, wantLoss)
			}
			if wantLoss && !strings.Contains(report.Corrupt.Err.Error(), "start record files of preparations in progress are in") {
				t.Errorf("Corrupt.Err = %q, want it to name the start record files", report.Corrupt.Err)
			}
		})
	}
}
