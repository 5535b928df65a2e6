package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

func TestRoundTrip(t *testing.T) {
	e := newTestEnv(t)
	s, report := e.open(t)
	if report != (OpenReport{Missing: true}) {
		t.Errorf("report for an empty dir = %+v, want only Missing", report)
	}
	ctx := t.Context()
	want := claimstate.New()
	for _, uid := range []string{"uid-1", "uid-2"} {
		c := testClaim(uid)
		want.Claims[uid] = c
		if err := s.Update(ctx, addClaim(c)); err != nil {
			t.Fatalf("Update: %v", err)
		}
	}
	got, err := s.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Read = %+v, want %+v", got, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(readFile(t, e.path())), &raw); err != nil {
		t.Fatal(err)
	}
	if len(raw) != 3 || string(raw["version"]) != `"v2"` || string(raw["bootID"]) != `"boot-a"` || raw["claims"] == nil {
		t.Errorf("file has top-level fields %v, want exactly version v2 (no dynamic MIG), bootID boot-a, claims", raw)
	}

	s2, report := e.open(t)
	if report != (OpenReport{}) {
		t.Errorf("reopen report = %+v, want zero", report)
	}
	got, err = s2.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("after reopen Read = %+v, want %+v", got, want)
	}
	if n := s2.writes.Load(); n != 0 {
		t.Errorf("reopening a current file wrote it %d times", n)
	}
}

// TestV5WireFormat pins the field names of v5: changing one breaks every
// existing file and needs a new version. Records are written verbatim but
// compact, whatever form the caller gave them in.
func TestV5WireFormat(t *testing.T) {
	c := testClaim("u")
	c.Devices = c.Devices[1:]
	c.Records = map[string]json.RawMessage{
		"vfio":    json.RawMessage(`{"devices": [ {"device": "gpu-vfio-1", "iommuGroup": 20} ]}`),
		"example": json.RawMessage(`"<&>"`),
	}
	st := &claimstate.State{Claims: map[string]*claimstate.Claim{"u": c}}
	data, err := encode("boot-x", st)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"version":"v5","bootID":"boot-x","requires":["example","vfio"],"claims":{"u":{"uid":"u","namespace":"ns-u","name":"claim-u",` +
		`"phase":"PrepareCompleted","startedAt":"2026-11-22T10:30:00.123456789Z",` +
		`"consumers":[{"name":"pod-u","uid":"pod-uid-u"}],"devices":[{"requests":["mig/small"],"pool":"node-1",` +
		`"name":"gpu-1-mig-1g10gb-19-0","shareID":"share-1","adminAccess":true,` +
		`"uuid":"MIG-11111111-2222-3333-4444-555555555555","parentUUID":"GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",` +
		`"cdiDeviceIDs":["k8s.gpu.nvidia.com/claim=u-mig"]}],` +
		`"records":{"example":"\u003c\u0026\u003e","vfio":{"devices":[{"device":"gpu-vfio-1","iommuGroup":20}]}}}}}` + "\n"
	if string(data) != want {
		t.Errorf("encoded\n%s\nwant\n%s", data, want)
	}
	d, err := testSchema.decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := canonicalizeRecords(st); err != nil {
		t.Fatal(err)
	}
	if d.from != versionV5 || d.bootID != "boot-x" || !reflect.DeepEqual(d.state, st) {
		t.Errorf("decode = %+v, want v5 boot-x %+v", d, st)
	}
}

// TestWrittenVersion: the Store writes v2 until a claim holds a record, so
// an older plugin keeps reading nodes whose claims need none; a v2 file is
// read without migration.
func TestWrittenVersion(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	ctx := t.Context()
	plain := testClaim("plain")
	if err := s.Update(ctx, addClaim(plain)); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, e.path()); !strings.HasPrefix(got, `{"version":"v2","bootID":"boot-a","claims":`) {
		t.Errorf("file without records = %s, want v2 without requires", got)
	}
	for _, step := range []struct {
		name   string
		mutate func(*claimstate.State) error
		want   string
	}{
		{"a MIG record", addClaim(withRecords(testClaim("mig"), recordDynamicMIG, `{"devices":[]}`)), `{"version":"v5","bootID":"boot-a","requires":["dynamicMIG"],`},
		{"an MPS record", addClaim(withRecords(testClaim("mps"), recordMPS, `{"daemons":[]}`)), `{"version":"v5","bootID":"boot-a","requires":["dynamicMIG","mps"],`},
		{"the MIG claim gone", func(st *claimstate.State) error { st.Remove("mig"); return nil }, `{"version":"v5","bootID":"boot-a","requires":["mps"],`},
		{"the MPS claim's record dropped", func(st *claimstate.State) error { st.Claims["mps"].Records = nil; return nil }, `{"version":"v2","bootID":"boot-a","claims":`},
	} {
		if err := s.Update(ctx, step.mutate); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := readFile(t, e.path()); !strings.HasPrefix(got, step.want) {
			t.Errorf("file after %s = %s, want it to begin %s", step.name, got, step.want)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, report := e.open(t)
	if report != (OpenReport{}) {
		t.Errorf("reopening a v2 file: report = %+v, want zero", report)
	}
	if got := mustRead(t, s2); !reflect.DeepEqual(got.Claims["plain"], plain) {
		t.Errorf("after reopen = %+v, want %+v", got.Claims["plain"], plain)
	}
}

func TestFailedMutationLeavesStateUnchanged(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	ctx := t.Context()
	if err := s.Update(ctx, addClaim(testClaim("keep"))); err != nil {
		t.Fatal(err)
	}
	before, fileBefore, writes := mustRead(t, s), readFile(t, e.path()), s.writes.Load()
	errRefused := errors.New("refused")
	tests := []struct {
		name    string
		mutate  func(*claimstate.State) error
		wantErr string
	}{
		{"mutation error", func(st *claimstate.State) error {
			delete(st.Claims, "keep")
			st.Claims["new"] = testClaim("new")
			return errRefused
		}, "refused"},
		{"unknown phase", func(st *claimstate.State) error {
			st.Claims["keep"].Phase = "Halfway"
			return nil
		}, `unknown phase "Halfway"`},
		{"key differs from uid", func(st *claimstate.State) error {
			st.Claims["other"] = testClaim("not-other")
			return nil
		}, "differs from its key"},
		{"nil claim", func(st *claimstate.State) error {
			st.Claims["nil"] = nil
			return nil
		}, "nil entry"},
		{"unencodable time", func(st *claimstate.State) error {
			st.Claims["keep"].StartedAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
			return nil
		}, "outside years"},
		{"record not JSON", func(st *claimstate.State) error {
			st.Claims["keep"].Records = map[string]json.RawMessage{"example": json.RawMessage(`{"devices":[`)}
			return nil
		}, `record "example" is not valid JSON`},
		{"record two JSON values", func(st *claimstate.State) error {
			st.Claims["keep"].Records = map[string]json.RawMessage{"example": json.RawMessage(`{} {}`)}
			return nil
		}, `record "example" is not valid JSON`},
		{"record empty", func(st *claimstate.State) error {
			st.Claims["keep"].Records = map[string]json.RawMessage{"example": nil}
			return nil
		}, `record "example" is empty`},
		{"record without a name", func(st *claimstate.State) error {
			st.Claims["keep"].Records = map[string]json.RawMessage{"": json.RawMessage(`{}`)}
			return nil
		}, "record with an empty name"},
		{"record unknown", func(st *claimstate.State) error {
			st.Claims["keep"].Records = map[string]json.RawMessage{"gpuFirmware": json.RawMessage(`{}`)}
			return nil
		}, `record "gpuFirmware": not a known record`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := s.Update(ctx, tt.mutate)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Update error = %v, want one containing %q", err, tt.wantErr)
			}
			if tt.name == "mutation error" && !errors.Is(err, errRefused) {
				t.Errorf("Update error %v does not wrap the mutation's error", err)
			}
			if got := mustRead(t, s); !reflect.DeepEqual(got, before) {
				t.Errorf("state changed to %+v", got)
			}
			if got := readFile(t, e.path()); got != fileBefore {
				t.Errorf("file changed to %s", got)
			}
			if n := s.writes.Load(); n != writes {
				t.Errorf("%d writes, want none", n-writes)
			}
		})
	}
}

func TestMutationPanicReachesCaller(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	func() {
		defer func() {
			p := recover()
			if err, ok := p.(error); !ok || !strings.Contains(err.Error(), "boom") {
				t.Errorf("recovered %v, want the mutation's panic", p)
			}
		}()
		_ = s.Update(t.Context(), func(st *claimstate.State) error {
			st.Claims["x"] = testClaim("x")
			panic("boom")
		})
	}()
	if err := s.Update(t.Context(), addClaim(testClaim("after"))); err != nil {
		t.Fatalf("Update after a panic: %v", err)
	}
	if got := mustRead(t, s); len(got.Claims) != 1 || got.Claims["after"] == nil {
		t.Errorf("state = %v, want only claim after", got.Claims)
	}
}

func TestUnchangedStateIsNotRewritten(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	c := testClaim("same")
	if err := s.Update(t.Context(), addClaim(c)); err != nil {
		t.Fatal(err)
	}
	writes := s.writes.Load()
	if err := s.Update(t.Context(), addClaim(c)); err != nil {
		t.Fatal(err)
	}
	if n := s.writes.Load() - writes; n != 0 {
		t.Errorf("an idempotent update wrote %d times", n)
	}
}

func TestUpdateCancelledWhileLocked(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	release := holdLock(t, e.dir)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := s.Update(ctx, addClaim(testClaim("late")))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Update with the lock held elsewhere = %v, want deadline exceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Update took %v to notice its deadline", d)
	}
	_, err = s.Read(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Read with an ended context = %v", err)
	}
	release()
	if got := mustRead(t, s); len(got.Claims) != 0 {
		t.Errorf("a cancelled Update landed: %v", got.Claims)
	}
	if err := s.Update(t.Context(), addClaim(testClaim("next"))); err != nil {
		t.Fatalf("Update after the holder let go: %v", err)
	}
}

func TestOpenCancelledWhileLocked(t *testing.T) {
	e := newTestEnv(t)
	release := holdLock(t, e.dir)
	defer release()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, _, err := Open(ctx, e.dir, e.options()...)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Open = %v, want deadline exceeded", err)
	}
}

func TestClose(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	release := holdLock(t, e.dir)
	queued := make(chan error)
	go func() { queued <- s.Update(context.Background(), addClaim(testClaim("queued"))) }()
	waitQueued(t, s, 1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-queued; !errors.Is(err, ErrClosed) {
		t.Errorf("queued Update at Close = %v, want ErrClosed", err)
	}
	release()
	if err := s.Update(t.Context(), addClaim(testClaim("x"))); !errors.Is(err, ErrClosed) {
		t.Errorf("Update after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Read(t.Context()); !errors.Is(err, ErrClosed) {
		t.Errorf("Read after Close = %v, want ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

func TestOpenRemovesStaleTempFiles(t *testing.T) {
	e := newTestEnv(t)
	stale := filepath.Join(e.dir, FileName+".tmp-123456")
	other := filepath.Join(e.dir, "unrelated.tmp-1")
	writeFile(t, stale, `{"version":"v2"`)
	writeFile(t, other, "x")
	e.open(t)
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale temp file still there: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("unrelated file touched: %v", err)
	}
}

func TestOpenFailsOnIOErrors(t *testing.T) {
	e := newTestEnv(t)
	notDir := filepath.Join(e.dir, "file")
	writeFile(t, notDir, "")
	if _, _, err := Open(t.Context(), filepath.Join(notDir, "sub"), e.options()...); err == nil {
		t.Error("Open under a regular file succeeded")
	}
	if _, _, err := Open(t.Context(), e.dir, WithBootIDPath(filepath.Join(e.dir, "missing"))); err == nil ||
		!strings.Contains(err.Error(), "boot ID") {
		t.Errorf("Open without a boot ID = %v, want a boot ID error", err)
	}
}

func mustRead(tb testing.TB, s *Store) *claimstate.State {
	tb.Helper()
	st, err := s.Read(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	return st
}
