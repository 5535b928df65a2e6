package checkpoint

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/internal/lockedfile"
)

// TestRecordsRoundTrip: records are kept verbatim but compact, in memory as
// in the file, and survive a reopen; the copies Read hands out share
// nothing with the Store.
func TestRecordsRoundTrip(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	ctx := t.Context()
	c := withRecords(testClaim("u"),
		recordMPS, `{ "daemons": [ {"id": "u", "devices": ["gpu-0"]} ] }`,
		"example", `[1, "two", {"three": null}, "<tag>"]`)
	if err := s.Update(ctx, addClaim(c)); err != nil {
		t.Fatal(err)
	}
	want := map[string]json.RawMessage{
		recordMPS: json.RawMessage(`{"daemons":[{"id":"u","devices":["gpu-0"]}]}`),
		"example": json.RawMessage(`[1,"two",{"three":null},"\u003ctag\u003e"]`),
	}
	got := mustRead(t, s)
	if !reflect.DeepEqual(got.Claims["u"].Records, want) {
		t.Errorf("records = %s, want %s", got.Claims["u"].Records, want)
	}
	got.Claims["u"].Records[recordMPS][0] = 'X'
	if again := mustRead(t, s); !reflect.DeepEqual(again.Claims["u"].Records, want) {
		t.Errorf("a caller's change to its copy reached the Store: %s", again.Claims["u"].Records)
	}
	writes := s.Writes()
	if err := s.Update(ctx, addClaim(c)); err != nil {
		t.Fatal(err)
	}
	if n := s.Writes() - writes; n != 0 {
		t.Errorf("the same records in another layout were written again (%d writes)", n)
	}
	_ = s.Close()
	s2, report := e.open(t)
	if report != (OpenReport{}) {
		t.Errorf("reopen report = %+v, want zero", report)
	}
	if got := mustRead(t, s2); !reflect.DeepEqual(got.Claims["u"].Records, want) {
		t.Errorf("records after reopen = %s, want %s", got.Claims["u"].Records, want)
	}
}

// TestUnknownRequiredRecords: a file that requires a record this process
// does not know is left alone like a newer version: it could not undo
// what the record describes.
func TestUnknownRequiredRecords(t *testing.T) {
	claim := func(records string) string {
		return `{"uid":"u","namespace":"n","name":"c","phase":"PrepareCompleted","startedAt":"2026-01-01T00:00:00Z","devices":[],"records":` + records + `}`
	}
	tests := []struct{ name, content, unknown string }{
		{"required and held", `{"version":"v5","bootID":"boot-a","requires":["example","gpuFirmware"],"claims":{"u":` +
			claim(`{"example":{},"gpuFirmware":{"flashed":"97.00.1"}}`) + `}}`, "gpuFirmware"},
		{"required only", `{"version":"v5","bootID":"boot-a","requires":["zeta","alpha"],"claims":{}}`, "alpha,zeta"},
		{"held but not listed", `{"version":"v5","bootID":"boot-a","requires":["example"],"claims":{"u":` +
			claim(`{"example":{},"gpuFirmware":{}}`) + `}}`, "gpuFirmware"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newTestEnv(t)
			e.writeCheckpoint(t, tt.content, false)
			s, report := e.open(t)
			if report != (OpenReport{NewerVersion: "v5", UnknownRecords: tt.unknown}) {
				t.Errorf("report = %+v, want NewerVersion v5 and UnknownRecords %s", report, tt.unknown)
			}
			for _, name := range strings.Split(tt.unknown, ",") {
				err := s.Update(t.Context(), addClaim(testClaim("x")))
				if !errors.Is(err, ErrNewerVersion) || !strings.Contains(err.Error(), name) {
					t.Errorf("Update = %v, want ErrNewerVersion naming %s", err, name)
				}
				if _, err := s.Read(t.Context()); !errors.Is(err, ErrNewerVersion) || !strings.Contains(err.Error(), name) {
					t.Errorf("Read = %v, want ErrNewerVersion naming %s", err, name)
				}
			}
			if got := readFile(t, e.path()); got != tt.content {
				t.Errorf("file changed to %s", got)
			}
			if kept := movedAside(t, e.dir); len(kept) != 0 {
				t.Errorf("file moved aside: %v", kept)
			}
			// Opened by a process that knows the record, it is read.
			_ = s.Close()
			s2, report := e.open(t, WithKnownRecords(strings.Split(tt.unknown, ",")...))
			if report != (OpenReport{}) {
				t.Errorf("report with the records known = %+v, want zero", report)
			}
			if _, err := s2.Read(t.Context()); err != nil {
				t.Errorf("Read with the records known: %v", err)
			}
		})
	}

	t.Run("written under a running Store", func(t *testing.T) {
		e := newTestEnv(t)
		s, _ := e.open(t)
		if err := s.Update(t.Context(), addClaim(testClaim("mine"))); err != nil {
			t.Fatal(err)
		}
		content := `{"version":"v5","bootID":"boot-a","requires":["gpuFirmware"],"claims":{"u":` + claim(`{"gpuFirmware":{}}`) + `}}`
		if err := lockedfile.Write(e.path(), []byte(content)); err != nil {
			t.Fatal(err)
		}
		if err := s.Update(t.Context(), addClaim(testClaim("x"))); !errors.Is(err, ErrNewerVersion) || !strings.Contains(err.Error(), "gpuFirmware") {
			t.Errorf("Update = %v, want ErrNewerVersion naming gpuFirmware", err)
		}
		if got := readFile(t, e.path()); got != content {
			t.Errorf("file changed to %s", got)
		}
		if s.NeedsAdoption() {
			t.Error("a file left alone was taken for a lost one")
		}
		// Moved aside by an operator: an empty start, as for a newer
		// version.
		if err := os.Remove(e.path()); err != nil {
			t.Fatal(err)
		}
		if err := s.Update(t.Context(), addClaim(testClaim("x"))); err != nil {
			t.Errorf("Update once the file is gone: %v", err)
		}
	})
}

// TestStoreWithoutKnownRecords: by default no record is known, so nothing
// can be stored that the next reader would have to refuse.
func TestStoreWithoutKnownRecords(t *testing.T) {
	e := newTestEnv(t)
	s, _, err := Open(t.Context(), e.dir, WithBootIDPath(e.bootIDPath), WithProcStatPath(e.statPath))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close() }()
	err = s.Update(t.Context(), addClaim(withRecords(testClaim("u"), recordMPS, `{}`)))
	if err == nil || !strings.Contains(err.Error(), `record "mps": not a known record (known: none)`) {
		t.Errorf("Update with a record = %v, want it refused as unknown", err)
	}
	if err := s.Update(t.Context(), addClaim(testClaim("plain"))); err != nil {
		t.Errorf("Update without records: %v", err)
	}
}
