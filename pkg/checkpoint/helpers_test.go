package checkpoint

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// testEnv is a checkpoint directory plus fake boot ID and /proc/stat files.
type testEnv struct {
	dir        string
	bootIDPath string
	statPath   string
	bootTime   time.Time
}

func newTestEnv(tb testing.TB) *testEnv {
	tb.Helper()
	sys := tb.TempDir()
	e := &testEnv{
		dir:        tb.TempDir(),
		bootIDPath: filepath.Join(sys, "boot_id"),
		statPath:   filepath.Join(sys, "stat"),
		bootTime:   time.Now().Add(-time.Hour).Truncate(time.Second),
	}
	e.setBootID(tb, "boot-a")
	writeFile(tb, e.statPath, fmt.Sprintf("cpu  10 0 5 100\nbtime %d\nprocesses 42\n", e.bootTime.Unix()))
	return e
}

func (e *testEnv) setBootID(tb testing.TB, id string) {
	tb.Helper()
	// Written with surrounding whitespace as the kernel does, to check trimming.
	writeFile(tb, e.bootIDPath, id+"\n")
}

// Record names the committed v5 file holds.
const (
	recordDynamicMIG  = "dynamicMIG"
	recordVFIO        = "vfio"
	recordTimeSlicing = "timeSlicing"
	recordMPS         = "mps"
)

// testRecords are the record names the tests' Stores know: those of the
// committed v5 file and one of the tests' own.
var testRecords = []string{recordDynamicMIG, recordVFIO, recordTimeSlicing, recordMPS, "example"}

// testSchema reads files as a Store opened with e.options() does.
var testSchema = newSchema(options{knownRecords: testRecords})

func (e *testEnv) options(extra ...Option) []Option {
	return append([]Option{WithBootIDPath(e.bootIDPath), WithProcStatPath(e.statPath), WithKnownRecords(testRecords...)}, extra...)
}

func (e *testEnv) path() string { return filepath.Join(e.dir, FileName) }

// open opens a Store that is closed when the test ends.
func (e *testEnv) open(tb testing.TB, extra ...Option) (*Store, OpenReport) {
	tb.Helper()
	_, ctx := ktesting.NewTestContext(tb)
	s, report, err := Open(ctx, e.dir, e.options(extra...)...)
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s, report
}

// writeCheckpoint puts content in place as the checkpoint file, with mtime
// after the fake boot time unless previousBoot.
func (e *testEnv) writeCheckpoint(tb testing.TB, content string, previousBoot bool) {
	tb.Helper()
	writeFile(tb, e.path(), content)
	if previousBoot {
		old := e.bootTime.Add(-10 * time.Minute)
		if err := os.Chtimes(e.path(), old, old); err != nil {
			tb.Fatal(err)
		}
	}
}

func writeFile(tb testing.TB, path, content string) {
	tb.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		tb.Fatal(err)
	}
}

func readFile(tb testing.TB, path string) string {
	tb.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		tb.Fatal(err)
	}
	return string(b)
}

// testClaim returns a claim with every field set.
func testClaim(uid string) *claimstate.Claim {
	return &claimstate.Claim{
		UID:       uid,
		Namespace: "ns-" + uid,
		Name:      "claim-" + uid,
		Phase:     claimstate.PrepareCompleted,
		StartedAt: time.Date(2026, 11, 22, 10, 30, 0, 123456789, time.UTC),
		Consumers: []claimstate.Consumer{{Name: "pod-" + uid, UID: "pod-uid-" + uid}},
		Devices: []claimstate.Device{
			{
				Requests:     []string{"gpus"},
				Pool:         "node-1",
				Name:         "gpu-0",
				UUID:         "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
				CDIDeviceIDs: []string{"k8s.gpu.nvidia.com/claim=" + uid + "-gpu-0"},
			},
			{
				Requests:     []string{"mig/small"},
				Pool:         "node-1",
				Name:         "gpu-1-mig-1g10gb-19-0",
				ShareID:      "share-1",
				AdminAccess:  true,
				UUID:         "MIG-11111111-2222-3333-4444-555555555555",
				ParentUUID:   "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
				CDIDeviceIDs: []string{"k8s.gpu.nvidia.com/claim=" + uid + "-mig"},
			},
		},
	}
}

// withRecords sets c's records from name/JSON pairs and returns c.
func withRecords(c *claimstate.Claim, nameJSON ...string) *claimstate.Claim {
	c.Records = map[string]json.RawMessage{}
	for i := 0; i+1 < len(nameJSON); i += 2 {
		c.Records[nameJSON[i]] = json.RawMessage(nameJSON[i+1])
	}
	return c
}

func addClaim(c *claimstate.Claim) func(*claimstate.State) error {
	return func(st *claimstate.State) error {
		st.Claims[c.UID] = c.Clone()
		return nil
	}
}

// holdLock takes the checkpoint lock of dir on a descriptor of its own, as
// another process would.
func holdLock(tb testing.TB, dir string) (release func()) {
	tb.Helper()
	f, err := os.OpenFile(filepath.Join(dir, LockFileName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		tb.Fatal(err)
	}
	return func() { _ = f.Close() }
}

// waitQueued waits until n requests are queued in s.
func waitQueued(tb testing.TB, s *Store, n int) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.queued() != n {
		if time.Now().After(deadline) {
			tb.Fatalf("%d requests queued, want %d", s.queued(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// movedAside lists the moved-aside checkpoint files in dir.
func movedAside(tb testing.TB, dir string) []string {
	tb.Helper()
	m, err := filepath.Glob(filepath.Join(dir, FileName+corruptInfix+"*"))
	if err != nil {
		tb.Fatal(err)
	}
	return m
}

// dump shows a state in failure messages.
func dump(st *claimstate.State) string {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return fmt.Sprintf("%+v (%v)", st, err)
	}
	return string(b)
}
