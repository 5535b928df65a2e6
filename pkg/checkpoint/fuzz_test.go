package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// fuzzPool is the node pool of the pooled schema the fuzz targets read with,
// as the plugin's Store does (WithPool).
const fuzzPool = "node-1"

// fuzzBootID is the boot of the committed example files; FuzzOpen runs in
// that boot, so that they are read, not discarded as a previous boot's.
const fuzzBootID = "3ee9bf4e-2bc3-4adb-a604-5bd7215f0766"

// fuzzSchemas are the two ways a file is read: as the plugin reads it (with
// its pool) and without a pool.
var fuzzSchemas = []schema{
	newSchema(options{knownRecords: testRecords, pool: fuzzPool}),
	testSchema,
}

// addCheckpointSeeds adds every committed example file, and a few damaged
// ones, with each ops value.
func addCheckpointSeeds(f *testing.F, ops ...[]byte) {
	f.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "v*.json"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no committed checkpoints in testdata: %v", err)
	}
	var seeds [][]byte
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, data, data[:len(data)/2])
	}
	seeds = append(seeds,
		[]byte(`{"version":"v6","bootID":"b","claims":{}}`),
		[]byte(`{"version":"v5","bootID":"b","requires":["unknown"],"claims":{}}`),
		[]byte(`{"version":"v2","bootID":"b","claims":{"a":null}}`),
		[]byte(`{"version":"v2","bootID":"b","claims":{"a":{"uid":"a","phase":"PrepareCompleted","startedAt":"2026-01-01T00:00:00+02:00","devices":[{"name":"gpu-0"}]}}}`),
		[]byte(`{"version":"v5","bootID":"b","requires":["example"],"claims":{"a":{"uid":"a","phase":"PrepareStarted","startedAt":"0001-01-01T00:00:00Z","devices":null,"records":{"example":{ "x" : "<&>" }}}}}`),
		[]byte(`{"version":"v4","bootID":"b","claims":{"a":{"uid":"a","phase":"PrepareCompleted","devices":[{"name":"m","dynamicMIG":{"profile":"1g.10gb"},"sharing":{"timeSlice":"Long","mpsDaemon":"d"},"vfio":{"gpu":"0000:01:00.0","functions":[{}]}}]}}}`),
		[]byte(`{"version":`), []byte(`null`), []byte(`{"version":"v02"}`), []byte(``),
	)
	for _, seed := range seeds {
		seed = bytes.ReplaceAll(seed, []byte(`"bootID":"b"`), []byte(`"bootID":"`+fuzzBootID+`"`))
		for _, o := range ops {
			f.Add(seed, o)
		}
	}
}

// FuzzDecode checks the checkpoint decoder on arbitrary bytes: it never
// panics; what it refuses, it refuses with a message; what it accepts is
// valid, encodes, and decodes again to the same state and the same bytes;
// and every state that claim-state mutations (the kind Prepare, Unprepare,
// the sweep and adoption make, chosen by ops) produce from it and that the
// Store would accept round-trips the same way.
func FuzzDecode(f *testing.F) {
	addCheckpointSeeds(f, nil, []byte{0, 5, 10, 15}, []byte{3, 2, 1, 0, 255, 128, 64})
	f.Fuzz(func(t *testing.T, data, ops []byte) {
		for _, sc := range fuzzSchemas {
			d, err := sc.decode(data)
			if err != nil {
				if err.Error() == "" {
					t.Fatalf("decode error without a message")
				}
				continue
			}
			if d.state == nil {
				t.Fatalf("decode accepted %q without a state", data)
			}
			if err := sc.validate(d.state); err != nil {
				t.Fatalf("decode accepted an invalid state: %v", err)
			}
			roundTrip(t, sc, d.state, "decoded")

			next := d.state
			for i, op := range ops {
				r := &request{mutate: mutation(next, op, i)}
				out, ok := r.apply(next, sc)
				if r.panicked != nil {
					t.Fatalf("mutation %d panicked: %v", i, r.panicked)
				}
				if !ok {
					continue // refused, as Update would: nothing is written
				}
				roundTrip(t, sc, out, fmt.Sprintf("after mutation %d (op %d)", i, op))
				next = out
			}
		}
	})
}

// roundTrip checks that st, which passed the schema, encodes, decodes to
// the same state in the version the Store writes, and encodes to the same
// bytes again.
func roundTrip(t *testing.T, sc schema, st *claimstate.State, what string) {
	t.Helper()
	const bootID = "boot-fuzz"
	data, err := encode(bootID, st)
	if err != nil {
		t.Fatalf("%s: encode: %v\n%s", what, err, dump(st))
	}
	back, err := sc.decode(data)
	if err != nil {
		t.Fatalf("%s: the encoded state does not decode: %v\n%s", what, err, data)
	}
	if back.bootID != bootID || !written(back.from) || back.poolFilled != 0 {
		t.Fatalf("%s: read back bootID %q from %q with %d pools filled", what, back.bootID, back.from, back.poolFilled)
	}
	if !sameState(back.state, st) {
		t.Fatalf("%s: state changed in a round trip:\nbefore %s\nafter  %s\nfile %s", what, dump(st), dump(back.state), data)
	}
	again, err := encode(bootID, back.state)
	if err != nil || !bytes.Equal(again, data) {
		t.Fatalf("%s: encoding is not stable (%v):\n%s\n%s", what, err, data, again)
	}
}

// sameState compares states as the file can tell them apart: empty and nil
// lists are the same, and times are compared as instants in their zone.
func sameState(a, b *claimstate.State) bool {
	eq := equality.Semantic.Copy()
	if err := eq.AddFunc(func(x, y time.Time) bool {
		return x.Equal(y) && x.Format(time.RFC3339Nano) == y.Format(time.RFC3339Nano)
	}); err != nil {
		panic(err)
	}
	return eq.DeepEqual(a, b)
}

// fuzzRecords are records a mutation may store: known ones in forms that
// need canonicalizing, and some the Store must refuse.
var fuzzRecords = []json.RawMessage{
	json.RawMessage(`{"devices": [{"device": "gpu-0-mig-1g10gb-19-0", "giID": 7}]}`),
	json.RawMessage(` { "x" : "<&>\u2028" } `),
	json.RawMessage(`[]`),
	json.RawMessage(`"\ud800"`),
	json.RawMessage(``),
	json.RawMessage(`{"unterminated": `),
}

var fuzzRecordNames = []string{recordDynamicMIG, recordVFIO, recordTimeSlicing, recordMPS, "example", "unknown", ""}

// mutation turns op into one of the state machine's mutations of st: a
// start or completion record (with conflicts checked as Prepare does), a
// removal, or an adoption, over a few claims, devices and records.
func mutation(st *claimstate.State, op byte, i int) func(*claimstate.State) error {
	// The claims of the file count too, so that mutations meet records
	// decoded rather than made here.
	uids := append([]string{"claim-a", "claim-b", "claim-c"}, slices.Sorted(maps.Keys(st.Claims))...)
	uid := uids[int(op>>2)%len(uids)]
	pool := fuzzPool
	if op&0x40 != 0 {
		pool = ""
	}
	devices := []claimstate.Device{{Requests: []string{"gpu"}, Pool: pool, Name: fmt.Sprintf("gpu-%d", op>>4&3)}}
	if op&0x80 != 0 {
		devices = append(devices, claimstate.Device{Requests: []string{"mig/small"}, Pool: pool, Name: "gpu-1-mig-1g10gb-19-0", ShareID: "s", AdminAccess: op&1 != 0,
			UUID: "MIG-1", ParentUUID: "GPU-1", CDIDeviceIDs: []string{"k8s.gpu.nvidia.com/claim=" + uid + "-mig"}})
	}
	records := map[string]json.RawMessage{
		fuzzRecordNames[int(op)%len(fuzzRecordNames)]: fuzzRecords[int(op>>1)%len(fuzzRecords)],
	}
	if op%5 == 0 {
		records = nil
	}
	in := claimstate.Intent{UID: uid, Namespace: "ns", Name: "claim", Devices: devices, Records: records,
		Consumers: []claimstate.Consumer{{Name: "pod", UID: "pod-" + uid}}}
	now := time.Date(2026, 11, 22, 10, 30, i, int(op)*1000003, time.UTC)
	switch op & 3 {
	case 0:
		return func(s *claimstate.State) error { return s.RecordStarted(in, now) }
	case 1:
		return func(s *claimstate.State) error { return s.RecordCompleted(in, now) }
	case 2:
		return func(s *claimstate.State) error { s.Remove(uid); return nil }
	default:
		return func(s *claimstate.State) error {
			if !s.Adopt(uid, devices, records, now) {
				return errors.New("not adopted")
			}
			return nil
		}
	}
}

// FuzzOpen puts arbitrary bytes in place as the checkpoint of the current
// boot and opens a Store on it: Open never fails and never panics because
// of the content; it uses the file, adopts NVIDIA's, leaves a newer one
// alone, or moves it aside and asks for adoption. A file it used as it was reads
// back as the state the Store serves.
func FuzzOpen(f *testing.F) {
	addCheckpointSeeds(f, nil)
	f.Fuzz(func(t *testing.T, data, _ []byte) {
		e := newTestEnv(t)
		e.setBootID(t, fuzzBootID)
		writeFile(t, e.path(), string(data))
		ctx := klog.NewContext(t.Context(), klog.Logger{}) // discards: logging each run would dominate
		s, report, err := Open(ctx, e.dir, e.options(WithPool(fuzzPool))...)
		if err != nil {
			t.Fatalf("Open failed because of the content %q: %v", data, err)
		}
		defer func() { _ = s.Close() }()
		st, readErr := s.Read(ctx)
		switch {
		case report.Corrupt != nil:
			if !errors.Is(readErr, ErrNeedsAdoption) || !s.NeedsAdoption() {
				t.Fatalf("corrupt file (%v), but Read = %v", report.Corrupt.Err, readErr)
			}
			if len(movedAside(t, e.dir)) != 1 {
				t.Fatalf("corrupt file not moved aside")
			}
			if err := s.Recover(ctx, func(*claimstate.State) error { return nil }); err != nil {
				t.Fatalf("Recover: %v", err)
			}
		case report.NewerVersion != "":
			if !errors.Is(readErr, ErrNewerVersion) {
				t.Fatalf("newer file (%s), but Read = %v", report.NewerVersion, readErr)
			}
			if got := readFile(t, e.path()); got != string(data) {
				t.Fatalf("a newer file was rewritten:\n%s", got)
			}
		case readErr != nil:
			t.Fatalf("Open reported nothing wrong (%+v), but Read = %v", report, readErr)
		default:
			d, err := newSchema(options{knownRecords: testRecords, pool: fuzzPool}).decode([]byte(readFile(t, e.path())))
			if err != nil {
				t.Fatalf("the file the Store uses does not decode: %v", err)
			}
			if !sameState(d.state, st) {
				t.Fatalf("the Store serves another state than its file:\n%s\n%s", dump(st), dump(d.state))
			}
		}
	})
}
