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
	if report != (OpenReport{}) {
		t.Errorf("report for an empty dir = %+v, want zero", report)
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

// TestV3WireFormat pins the field names of v3: changing one breaks every
// existing file and needs a new version.
func TestV3WireFormat(t *testing.T) {
	c := testClaim("u")
	c.Devices = c.Devices[1:]
	c.Devices[0].DynamicMIG = &claimstate.DynamicMIG{Profile: "1g.10gb", ProfileID: 19, Start: 0, Size: 1, GIID: 7, CIID: 0}
	st := &claimstate.State{Claims: map[string]*claimstate.Claim{"u": c}}
	data, err := encode("boot-x", st)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"version":"v3","bootID":"boot-x","claims":{"u":{"uid":"u","namespace":"ns-u","name":"claim-u",` +
		`"phase":"PrepareCompleted","startedAt":"2026-11-22T10:30:00.123456789Z",` +
		`"consumers":[{"name":"pod-u","uid":"pod-uid-u"}],"devices":[{"requests":["mig/small"],"pool":"node-1",` +
		`"name":"gpu-1-mig-1g10gb-19-0","shareID":"share-1","adminAccess":true,` +
		`"uuid":"MIG-11111111-2222-3333-4444-555555555555","parentUUID":"GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",` +
		`"cdiDeviceIDs":["k8s.gpu.nvidia.com/claim=u-mig"],` +
		`"dynamicMIG":{"profile":"1g.10gb","profileID":19,"start":0,"size":1,"giID":7}}]}}}` + "\n"
	if string(data) != want {
		t.Errorf("encoded\n%s\nwant\n%s", data, want)
	}
	d, err := testSchema.decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if d.from != versionV3 || d.bootID != "boot-x" || !reflect.DeepEqual(d.state, st) {
		t.Errorf("decode = %+v, want v3 boot-x %+v", d, st)
	}
}

// TestV4WireFormat pins the field names v4 adds: devices[].sharing.
func TestV4WireFormat(t *testing.T) {
	c := testClaim("u")
	c.Devices = c.Devices[:1]
	c.Devices[0].Sharing = &claimstate.Sharing{TimeSlice: "Long", MPSDaemon: "u"}
	c.Devices[0].VFIO = &claimstate.VFIO{GPU: "0000:1b:00.0", IOMMUGroup: 20, Functions: []claimstate.VFIOFunction{{BusID: "0000:1b:00.0", Driver: "vfio-pci", OriginalDriver: "nvidia"}}}
	st := &claimstate.State{Claims: map[string]*claimstate.Claim{"u": c}}
	data, err := encode("boot-x", st)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(data), `{"version":"v4",`) || !strings.Contains(string(data), `"sharing":{"timeSlice":"Long","mpsDaemon":"u"}`) ||
		!strings.Contains(string(data), `"vfio":{"gpu":"0000:1b:00.0","iommuGroup":20,"functions":[{"busID":"0000:1b:00.0","driver":"vfio-pci","originalDriver":"nvidia"}]}`) {
		t.Errorf("encoded %s, want v4 with devices[].sharing and devices[].vfio", data)
	}
	d, err := testSchema.decode(data)
	if err != nil {
		t.Fatal(err)
	}
	if d.from != versionV4 || !reflect.DeepEqual(d.state, st) {
		t.Errorf("decode = %+v, want v4 %+v", d, st)
	}
}

// TestWrittenVersion: the Store writes v2 until a claim holds a dynamic MIG
// device (v3) or a shared device (v4), so an older plugin keeps reading
// nodes that never used them; a v2 file is read without migration.
func TestWrittenVersion(t *testing.T) {
	e := newTestEnv(t)
	s, _ := e.open(t)
	ctx := t.Context()
	plain := testClaim("plain")
	if err := s.Update(ctx, addClaim(plain)); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, e.path()); !strings.HasPrefix(got, `{"version":"v2"`) {
		t.Errorf("file without dynamic MIG = %s, want v2", got)
	}
	mig := testClaim("mig")
	mig.Devices = mig.Devices[1:]
	mig.Devices[0].DynamicMIG = &claimstate.DynamicMIG{Profile: "1g.10gb", ProfileID: 19, Start: 3, Size: 1}
	if err := s.Update(ctx, addClaim(mig)); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, e.path()); !strings.HasPrefix(got, `{"version":"v3"`) {
		t.Errorf("file with dynamic MIG = %s, want v3", got)
	}
	shared := testClaim("shared")
	shared.Devices = shared.Devices[:1]
	shared.Devices[0].Sharing = &claimstate.Sharing{MPSDaemon: "shared"}
	if err := s.Update(ctx, addClaim(shared)); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, e.path()); !strings.HasPrefix(got, `{"version":"v4"`) {
		t.Errorf("file with a shared device = %s, want v4", got)
	}
	if err := s.Update(ctx, func(st *claimstate.State) error { st.Remove("shared"); return nil }); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, e.path()); !strings.HasPrefix(got, `{"version":"v3"`) {
		t.Errorf("file once the shared claim is gone = %s, want v3 again", got)
	}
	if err := s.Update(ctx, func(st *claimstate.State) error { st.Remove("mig"); return nil }); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, e.path()); !strings.HasPrefix(got, `{"version":"v2"`) {
		t.Errorf("file once the dynamic MIG claim is gone = %s, want v2 again", got)
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
	stale := filepath.Join(e.dir, FileName+tempInfix+"123456")
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

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f.json")
	for _, content := range []string{"first", "second, longer content"} {
		if err := WriteFileAtomic(path, []byte(content)); err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, path); got != content {
			t.Errorf("content = %q, want %q", got, content)
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode = %v, want 0600", fi.Mode().Perm())
	}
	if err := WriteFileAtomic(filepath.Join(dir, "missing", "f"), nil); err == nil {
		t.Error("WriteFileAtomic into a missing directory succeeded")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only f.json", len(entries))
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
