package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/internal/lockedfile"
	"github.com/gpudra/gpudra/pkg/claimstate"
)

// TestVersionsNotRead: a file in a schema version this plugin does not
// read is never misread and never lost. v1, v3 and v4 (development schemas,
// never released) are unreadable like any other version up to v5 that is
// not read: moved aside with their bytes, the Store then needing adoption
// (or, for a file older than the boot, a quiet boot reset). A version above
// v5 (v9) may be a newer plugin's and is left in place, untouched. Either
// way the error names the versions that are read.
func TestVersionsNotRead(t *testing.T) {
	const claim = `"u":{"uid":"u","namespace":"n","name":"c","phase":"PrepareCompleted","startedAt":"2026-01-01T00:00:00Z","devices":[`
	tests := []struct {
		version, content string
		// newer: left alone as a newer version, not moved aside.
		newer bool
	}{
		{version: "v1", content: `{"version":"v1","preparedClaims":{"u":{"status":"Completed","namespace":"n","name":"c","devices":["gpu-0"]}}}`},
		{version: "v3", content: `{"version":"v3","bootID":"boot-a","claims":{` + claim +
			`{"requests":["mig"],"pool":"node-1","name":"gpu-1-mig-1g10gb-19-0","parentUUID":"GPU-a","dynamicMIG":{"profile":"1g.10gb","profileID":19,"start":0,"size":1,"giID":7}}]}}}`},
		{version: "v4", content: `{"version":"v4","bootID":"boot-a","claims":{` + claim +
			`{"requests":["gpus"],"pool":"node-1","name":"gpu-0","uuid":"GPU-0","sharing":{"timeSlice":"Long","mpsDaemon":"d"}},` +
			`{"requests":["vm"],"pool":"node-1","name":"gpu-vfio-5","vfio":{"gpu":"0000:1b:00.0","iommuGroup":20,"functions":[{"busID":"0000:1b:00.0","driver":"vfio-pci"}]}}]}}}`},
		{version: "v9", content: `{"version":"v9","bootID":"boot-a","claims":{` + claim + `{"pool":"node-1","name":"gpu-0"}]}}}`, newer: true},
	}
	for _, tt := range tests {
		for _, previousBoot := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s previous boot %v", tt.version, previousBoot), func(t *testing.T) {
				e := newTestEnv(t)
				e.writeCheckpoint(t, tt.content, previousBoot)

				// Peek only reads: an error, whatever the file's age.
				_, peekErr := Peek(e.dir, e.options()...)
				if tt.newer {
					want := `schema version "` + tt.version + `", newer than the versions this plugin reads (v2 and v5)`
					if !errors.Is(peekErr, ErrNewerVersion) || !strings.Contains(peekErr.Error(), want) {
						t.Errorf("Peek = %v, want ErrNewerVersion saying %q", peekErr, want)
					}
					s, report := e.open(t)
					if report != (OpenReport{NewerVersion: tt.version}) {
						t.Errorf("report = %+v, want NewerVersion %s only", report, tt.version)
					}
					if err := s.Update(t.Context(), addClaim(testClaim("x"))); !errors.Is(err, ErrNewerVersion) || !strings.Contains(err.Error(), want) {
						t.Errorf("Update = %v, want ErrNewerVersion saying %q", err, want)
					}
					if _, err := s.Read(t.Context()); !errors.Is(err, ErrNewerVersion) {
						t.Errorf("Read = %v, want ErrNewerVersion", err)
					}
					if got := readFile(t, e.path()); got != tt.content {
						t.Errorf("file changed to %s", got)
					}
					if kept := movedAside(t, e.dir); len(kept) != 0 {
						t.Errorf("moved aside: %v", kept)
					}
					return
				}

				want := `schema version "` + tt.version + `" is not one this plugin reads (it reads v2 and v5)`
				if peekErr == nil || errors.Is(peekErr, ErrNewerVersion) || !strings.Contains(peekErr.Error(), want) {
					t.Errorf("Peek = %v, want an error saying %q", peekErr, want)
				}
				stamp := time.Date(2026, 11, 22, 8, 9, 10, 11, time.UTC)
				s, report := e.open(t, WithClock(func() time.Time { return stamp }))
				kept := movedAside(t, e.dir)
				if len(kept) != 1 || readFile(t, kept[0]) != tt.content {
					t.Fatalf("moved-aside files %v, want one holding the original bytes", kept)
				}
				if previousBoot {
					if report != (OpenReport{BootIDChanged: true}) {
						t.Errorf("report = %+v, want BootIDChanged only", report)
					}
					if got := mustRead(t, s); len(got.Claims) != 0 {
						t.Errorf("state = %v, want empty", got.Claims)
					}
					return
				}
				if report.Corrupt == nil || report.Corrupt.Path != kept[0] || !strings.Contains(report.Corrupt.Err.Error(), want) {
					t.Fatalf("report = %+v, want Corrupt at %s saying %q", report, kept[0], want)
				}
				if report.Migrated != "" || report.BootIDChanged || report.NewerVersion != "" {
					t.Errorf("report = %+v, want only Corrupt", report)
				}
				// Its claims may still be prepared on the node: nothing is
				// served until they are adopted.
				if _, err := s.Read(t.Context()); !errors.Is(err, ErrNeedsAdoption) {
					t.Errorf("Read = %v, want ErrNeedsAdoption", err)
				}
				if err := s.Recover(t.Context(), addClaim(testClaim("adopted"))); err != nil {
					t.Fatalf("Recover: %v", err)
				}
				d, err := testSchema.decode([]byte(readFile(t, e.path())))
				if err != nil || d.from != versionV2 || len(d.state.Claims) != 1 || d.state.Claims["adopted"] == nil {
					t.Errorf("file after Recover: from %q, err %v, claims %v; want v2 with the adopted claim", d.from, err, d.state)
				}
				if got := readFile(t, kept[0]); got != tt.content {
					t.Errorf("moved-aside file changed by Recover to %q", got)
				}
			})
		}
	}
}

func TestUnreadableFileMovedAside(t *testing.T) {
	valid := `{"version":"v2","bootID":"boot-a","claims":{"u":{"uid":"u","namespace":"n","name":"c","phase":"PrepareCompleted","startedAt":"2026-01-01T00:00:00Z","devices":[]}}}`
	tests := []struct {
		name, content, wantErr string
	}{
		{"empty", "", "unexpected end of JSON input"},
		{"truncated", valid[:len(valid)/2], "unexpected end of JSON input"},
		{"not JSON", "\x00\x00\x00\x00garbage", "invalid character"},
		{"trailing garbage", valid + "}", "invalid character"},
		{"JSON null", "null", `schema version "" is not one this plugin reads (it reads v2 and v5)`},
		{"array", "[]", "cannot unmarshal array"},
		{"no version", `{"claims":{}}`, `schema version "" is not one`},
		{"version not a string", `{"version":2,"claims":{}}`, "cannot unmarshal number"},
		{"version without v", `{"version":"3"}`, `schema version "3" is not one`},
		{"version v0", `{"version":"v0"}`, `schema version "v0" is not one`},
		{"version not canonical", `{"version":"v03"}`, `schema version "v03" is not one`},
		{"claims wrong type", `{"version":"v2","bootID":"boot-a","claims":[]}`, "cannot unmarshal array"},
		{"startedAt wrong type", strings.Replace(valid, `"2026-01-01T00:00:00Z"`, `17`, 1), "not a JSON string"},
		{"null claim", `{"version":"v2","bootID":"boot-a","claims":{"u":null}}`, "null entry"},
		{"uid differs from key", strings.Replace(valid, `"uid":"u"`, `"uid":"w"`, 1), "differs from its key"},
		{"unknown phase", strings.Replace(valid, "PrepareCompleted", "Prepared", 1), `unknown phase "Prepared"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t)
			e.writeCheckpoint(t, tt.content, false)
			stamp := time.Date(2026, 11, 22, 8, 9, 10, 11, time.UTC)
			s, report := e.open(t, WithClock(func() time.Time { return stamp }))
			if report.Corrupt == nil {
				t.Fatalf("report = %+v, want Corrupt", report)
			}
			if report.Migrated != "" || report.BootIDChanged || report.NewerVersion != "" {
				t.Errorf("report = %+v, want only Corrupt", report)
			}
			if !strings.Contains(report.Corrupt.Err.Error(), tt.wantErr) {
				t.Errorf("Corrupt.Err = %v, want one containing %q", report.Corrupt.Err, tt.wantErr)
			}
			wantPath := e.path() + ".corrupt-20261122T080910.000000011Z"
			if report.Corrupt.Path != wantPath {
				t.Errorf("moved to %s, want %s", report.Corrupt.Path, wantPath)
			}
			if got := readFile(t, report.Corrupt.Path); got != tt.content {
				t.Errorf("moved-aside file holds %q, want the original %q", got, tt.content)
			}
			// The state is lost: nothing may be prepared until the claims
			// on the node are adopted.
			if !s.NeedsAdoption() {
				t.Error("NeedsAdoption = false after moving the file aside")
			}
			if _, err := os.Stat(filepath.Join(e.dir, AdoptPendingFileName)); err != nil {
				t.Errorf("adopt-pending marker: %v", err)
			}
			if _, err := s.Read(t.Context()); !errors.Is(err, ErrNeedsAdoption) {
				t.Errorf("Read after moving aside = %v, want ErrNeedsAdoption", err)
			}
			if err := s.Update(t.Context(), addClaim(testClaim("early"))); !errors.Is(err, ErrNeedsAdoption) {
				t.Errorf("Update after moving aside = %v, want ErrNeedsAdoption", err)
			}
			err := s.Recover(t.Context(), func(st *claimstate.State) error {
				if len(st.Claims) != 0 {
					t.Errorf("Recover sees %v, want an empty state", st.Claims)
				}
				return addClaim(testClaim("fresh"))(st)
			})
			if err != nil {
				t.Fatalf("Recover after moving aside: %v", err)
			}
			if s.NeedsAdoption() {
				t.Error("NeedsAdoption = true after Recover")
			}
			_ = s.Close()
			s2, report := e.open(t, WithClock(func() time.Time { return stamp }))
			if report != (OpenReport{}) {
				t.Errorf("reopen report = %+v, want zero", report)
			}
			if got := mustRead(t, s2); got.Claims["fresh"] == nil {
				t.Errorf("update after moving aside lost: %v", got.Claims)
			}
		})
	}
}

func TestMoveAsideNeverReplaces(t *testing.T) {
	e := newTestEnv(t)
	stamp := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := WithClock(func() time.Time { return stamp })
	var paths []string
	for _, content := range []string{"first{", "second{"} {
		e.writeCheckpoint(t, content, false)
		s, report := e.open(t, clock)
		if report.Corrupt == nil {
			t.Fatalf("report = %+v, want Corrupt", report)
		}
		paths = append(paths, report.Corrupt.Path)
		_ = s.Close()
	}
	base := e.path() + ".corrupt-20260102T030405.000000000Z"
	if !reflect.DeepEqual(paths, []string{base, base + "-1"}) {
		t.Errorf("moved to %v, want %s and its -1", paths, base)
	}
	if got := readFile(t, paths[0]); got != "first{" {
		t.Errorf("first moved-aside file holds %q", got)
	}
}

// TestTornFileOfPreviousBoot: without fsync a power loss can leave an empty
// or torn file; it is a boot reset, not corruption, but still kept.
func TestTornFileOfPreviousBoot(t *testing.T) {
	for _, content := range []string{"", `{"version":"v2","bootID":"boot-old","cla`} {
		e := newTestEnv(t)
		e.writeCheckpoint(t, content, true)
		s, report := e.open(t)
		if report != (OpenReport{BootIDChanged: true}) {
			t.Errorf("report = %+v, want BootIDChanged only", report)
		}
		if got := mustRead(t, s); len(got.Claims) != 0 {
			t.Errorf("state = %v, want empty", got.Claims)
		}
		if kept := movedAside(t, e.dir); len(kept) != 1 || readFile(t, kept[0]) != content {
			t.Errorf("moved-aside files %v, want one holding %q", kept, content)
		}
	}
}

func TestBootIDChangeResets(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	if err := s.Update(t.Context(), addClaim(testClaim("before-reboot"))); err != nil {
		t.Fatal(err)
	}
	_ = s.Close()

	e.setBootID(t, "boot-b")
	s, report := e.open(t)
	if report != (OpenReport{BootIDChanged: true}) {
		t.Errorf("report = %+v, want BootIDChanged only", report)
	}
	if got := mustRead(t, s); len(got.Claims) != 0 {
		t.Errorf("claims survived a reboot: %v", got.Claims)
	}
	d, err := testSchema.decode([]byte(readFile(t, e.path())))
	if err != nil || d.bootID != "boot-b" || len(d.state.Claims) != 0 {
		t.Errorf("file after reset: bootID %q, %d claims, err %v; want boot-b, none", d.bootID, len(d.state.Claims), err)
	}
	if kept := movedAside(t, e.dir); len(kept) != 0 {
		t.Errorf("a readable file of a previous boot was moved aside: %v", kept)
	}
}

// TestBootIDBeatsMtime: a v2 file records its boot, so its age does not
// matter (a clock stepped back after boot must not reset state).
func TestBootIDBeatsMtime(t *testing.T) {
	e := newTestEnv(t)
	data, err := encode("boot-a", &claimstate.State{Claims: map[string]*claimstate.Claim{"u": testClaim("u")}})
	if err != nil {
		t.Fatal(err)
	}
	e.writeCheckpoint(t, string(data), true)
	s, report := e.open(t)
	if report != (OpenReport{}) {
		t.Errorf("report = %+v, want zero", report)
	}
	if got := mustRead(t, s); got.Claims["u"] == nil {
		t.Errorf("claims of this boot dropped: %v", got.Claims)
	}
}

func TestNewerVersionIsNotOverwritten(t *testing.T) {
	tests := []struct{ name, content, version string }{
		{"v6", `{"version":"v6","bootID":"boot-a","claims":{"u":{"uid":"u","phase":"PrepareQueued"}},"quota":7}`, "v6"},
		{"v6 unlike v5", `{"version":"v6","claims":[{"uid":"u"}]}`, "v6"},
		{"v10", `{"version":"v10"}`, "v10"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t)
			e.writeCheckpoint(t, tt.content, false)
			s, report := e.open(t)
			if report != (OpenReport{NewerVersion: tt.version}) {
				t.Errorf("report = %+v, want NewerVersion %s only", report, tt.version)
			}
			err := s.Update(t.Context(), addClaim(testClaim("x")))
			if !errors.Is(err, ErrNewerVersion) || !strings.Contains(err.Error(), tt.version) {
				t.Errorf("Update = %v, want ErrNewerVersion naming %s", err, tt.version)
			}
			if _, err := s.Read(t.Context()); !errors.Is(err, ErrNewerVersion) {
				t.Errorf("Read = %v, want ErrNewerVersion", err)
			}
			if got := readFile(t, e.path()); got != tt.content {
				t.Errorf("newer file changed to %s", got)
			}
			if kept := movedAside(t, e.dir); len(kept) != 0 {
				t.Errorf("newer file moved aside: %v", kept)
			}

			// Rolled forward (or moved aside by an operator): work resumes.
			if err := os.Remove(e.path()); err != nil {
				t.Fatal(err)
			}
			if err := s.Update(t.Context(), addClaim(testClaim("x"))); err != nil {
				t.Fatalf("Update once the file is gone: %v", err)
			}
			if got := mustRead(t, s); got.Claims["x"] == nil {
				t.Errorf("state = %v, want claim x", got.Claims)
			}
		})
	}
}

// TestUnknownFieldsTolerated: a v5 file from a newer plugin that added
// optional fields is read; the fields are dropped on rewrite.
func TestUnknownFieldsTolerated(t *testing.T) {
	e := newTestEnv(t)
	e.writeCheckpoint(t, `{"version":"v5","bootID":"boot-a","nodeName":"n1","requires":["example"],"claims":{"u":{"uid":"u","namespace":"n",`+
		`"name":"c","phase":"PrepareStarted","startedAt":"2026-01-01T00:00:00Z","retries":3,`+
		`"devices":[{"requests":["r"],"pool":"p","name":"gpu-0","health":"ok"}],"records":{"example":{"a":1}}}}}`, false)
	s, report := e.open(t)
	if report != (OpenReport{}) {
		t.Errorf("report = %+v, want zero", report)
	}
	want := &claimstate.Claim{
		UID: "u", Namespace: "n", Name: "c", Phase: claimstate.PrepareStarted,
		StartedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
		Devices:   []claimstate.Device{{Requests: []string{"r"}, Pool: "p", Name: "gpu-0"}},
		Records:   map[string]json.RawMessage{"example": json.RawMessage(`{"a":1}`)},
	}
	if got := mustRead(t, s); !reflect.DeepEqual(got.Claims["u"], want) {
		t.Errorf("claim = %+v, want %+v", got.Claims["u"], want)
	}
	if err := s.Update(t.Context(), addClaim(testClaim("x"))); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, e.path()); strings.Contains(got, "nodeName") || strings.Contains(got, "retries") || strings.Contains(got, "health") {
		t.Errorf("unknown fields kept on rewrite: %s", got)
	}
}

// TestLaterFieldsIgnoredInV2: records and requires mean nothing in a v2
// file; like any unknown field they are ignored, not obeyed.
func TestLaterFieldsIgnoredInV2(t *testing.T) {
	e := newTestEnv(t)
	e.writeCheckpoint(t, `{"version":"v2","bootID":"boot-a","requires":["unheard-of"],"claims":{"u":{"uid":"u","namespace":"n",`+
		`"name":"c","phase":"PrepareCompleted","startedAt":"2026-01-01T00:00:00Z","devices":[],"records":{"unheard-of":{}}}}}`, false)
	s, report := e.open(t)
	if report != (OpenReport{}) {
		t.Errorf("report = %+v, want zero", report)
	}
	if got := mustRead(t, s).Claims["u"]; got == nil || got.Records != nil {
		t.Errorf("claim = %+v, want one without records", got)
	}
}

// TestFileReplacedUnderRunningStore: a file changed by someone else is
// picked up by the next Update or Read, whatever it holds.
func TestFileReplacedUnderRunningStore(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	if err := s.Update(t.Context(), addClaim(testClaim("mine"))); err != nil {
		t.Fatal(err)
	}

	data, err := encode("boot-a", &claimstate.State{Claims: map[string]*claimstate.Claim{"theirs": testClaim("theirs")}})
	if err != nil {
		t.Fatal(err)
	}
	if err := lockedfile.Write(e.path(), data); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t, s); len(got.Claims) != 1 || got.Claims["theirs"] == nil {
		t.Errorf("after an outside write Read = %v, want only claim theirs", got.Claims)
	}

	if err := lockedfile.Write(e.path(), []byte("{garbage")); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(t.Context(), addClaim(testClaim("after"))); !errors.Is(err, ErrNeedsAdoption) {
		t.Fatalf("Update over garbage = %v, want ErrNeedsAdoption", err)
	}
	if kept := movedAside(t, e.dir); len(kept) != 1 || readFile(t, kept[0]) != "{garbage" {
		t.Errorf("moved-aside files %v, want one holding the garbage", kept)
	}
	if err := s.Recover(t.Context(), addClaim(testClaim("after"))); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if got := mustRead(t, s); len(got.Claims) != 1 || got.Claims["after"] == nil {
		t.Errorf("Read = %v, want only claim after", got.Claims)
	}
}
