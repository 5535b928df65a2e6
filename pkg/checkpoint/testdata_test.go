package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// testdataBootID is the boot ID of the files in testdata.
const testdataBootID = "3ee9bf4e-2bc3-4adb-a604-5bd7215f0766"

// openTestdata opens a Store on a copy of testdata/name, written in the
// current boot.
func openTestdata(t *testing.T, name string, extra ...Option) (*testEnv, *Store, OpenReport) {
	t.Helper()
	e := newTestEnv(t)
	e.setBootID(t, testdataBootID)
	e.writeCheckpoint(t, readFile(t, filepath.Join("testdata", name)), false)
	s, report := e.open(t, extra...)
	return e, s, report
}

func TestReadV2(t *testing.T) {
	want := &claimstate.State{Claims: map[string]*claimstate.Claim{
		"5f0c9a38-2d7e-4b1a-9c61-0e8a7f3b2c10": {
			UID: "5f0c9a38-2d7e-4b1a-9c61-0e8a7f3b2c10", Namespace: "ml-team", Name: "trainer-gpus",
			Phase:     claimstate.PrepareCompleted,
			StartedAt: time.Date(2026, 11, 22, 10, 30, 0, 123456789, time.UTC),
			Consumers: []claimstate.Consumer{{Name: "trainer-0", UID: "0a1b2c3d-4e5f-4a6b-8c7d-000000000001"}},
			Devices: []claimstate.Device{
				{
					Requests: []string{"gpus"}, Pool: "node-1", Name: "gpu-0",
					UUID:         "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0",
					CDIDeviceIDs: []string{"k8s.gpu.nvidia.com/claim=5f0c9a38-2d7e-4b1a-9c61-0e8a7f3b2c10-gpu-0"},
				},
				{
					Requests: []string{"mig/small"}, Pool: "node-1", Name: "gpu-1-mig-1g10gb-19-0", ShareID: "share-1", AdminAccess: true,
					UUID: "MIG-11111111-2222-3333-4444-555555555555", ParentUUID: "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
					CDIDeviceIDs: []string{"k8s.gpu.nvidia.com/claim=5f0c9a38-2d7e-4b1a-9c61-0e8a7f3b2c10-mig"},
				},
			},
		},
		"a1e4c7d2-6b3f-4e89-8d20-7c5b9e1f4a63": {
			UID: "a1e4c7d2-6b3f-4e89-8d20-7c5b9e1f4a63", Namespace: "default", Name: "notebook",
			Phase:     claimstate.PrepareStarted,
			StartedAt: time.Date(2026, 11, 22, 10, 31, 0, 0, time.UTC),
			Devices:   []claimstate.Device{{Requests: []string{"gpu"}, Pool: "node-1", Name: "gpu-2"}},
		},
		// Recorded without a pool: read as it is without WithPool.
		"c9d8e7f6-1a2b-4c3d-9e8f-0a1b2c3d4e5f": {
			UID: "c9d8e7f6-1a2b-4c3d-9e8f-0a1b2c3d4e5f", Namespace: "ci", Name: "migrated-from-v1",
			Phase:   claimstate.PrepareCompleted,
			Devices: []claimstate.Device{{Name: "gpu-3"}},
		},
		"d4c3b2a1-0f9e-4d8c-b7a6-958473625140": {
			UID: "d4c3b2a1-0f9e-4d8c-b7a6-958473625140", Phase: claimstate.PrepareCompleted, Adopted: true,
			StartedAt: time.Date(2026, 11, 22, 11, 0, 0, 0, time.UTC),
			Devices: []claimstate.Device{{Pool: "node-1", Name: "gpu-4",
				CDIDeviceIDs: []string{"k8s.gpu.nvidia.com/claim=d4c3b2a1-0f9e-4d8c-b7a6-958473625140-gpu-4"}}},
		},
	}}

	t.Run("as written", func(t *testing.T) {
		_, s, report := openTestdata(t, "v2.json")
		if report != (OpenReport{}) {
			t.Errorf("report = %+v, want zero", report)
		}
		if got := mustRead(t, s); !reflect.DeepEqual(got, want) {
			t.Errorf("state = %s\nwant %s", dump(got), dump(want))
		}
		if n := s.Writes(); n != 0 {
			t.Errorf("a v2 file was rewritten %d times at Open", n)
		}
	})

	t.Run("with the node's pool", func(t *testing.T) {
		e, s, report := openTestdata(t, "v2.json", WithPool("node-1"))
		if report != (OpenReport{}) {
			t.Errorf("report = %+v, want zero", report)
		}
		got := mustRead(t, s)
		if d := got.Claims["c9d8e7f6-1a2b-4c3d-9e8f-0a1b2c3d4e5f"].Devices; len(d) != 1 || d[0].Pool != "node-1" {
			t.Errorf("device recorded without a pool = %+v, want pool node-1", d)
		}
		if n := s.Writes(); n != 1 {
			t.Errorf("file rewritten %d times at Open, want once to record the pool", n)
		}
		d, err := testSchema.decode([]byte(readFile(t, e.path())))
		if err != nil || !reflect.DeepEqual(d.state, got) {
			t.Errorf("file after Open: err %v, state %s, want %s", err, dump(d.state), dump(got))
		}
	})
}

// TestV5RoundTrip: the committed v5 file is read as it is, and the state
// encodes to exactly its bytes (compacted).
func TestV5RoundTrip(t *testing.T) {
	file := readFile(t, filepath.Join("testdata", "v5.json"))
	_, s, report := openTestdata(t, "v5.json")
	if report != (OpenReport{}) {
		t.Errorf("report = %+v, want zero", report)
	}
	if n := s.Writes(); n != 0 {
		t.Errorf("a v5 file was rewritten %d times at Open", n)
	}
	st := mustRead(t, s)
	if c := st.Claims["33333333-cccc-4ccc-8ccc-000000000002"]; c == nil || !c.Adopted || string(c.Records[recordVFIO]) !=
		`{"devices":[{"device":"gpu-vfio-5","gpu":"0000:1b:00.0","iommuGroup":20,"functions":[{"busID":"0000:1b:00.0","driver":"vfio-pci","originalDriver":"nvidia"}]}]}` {
		t.Errorf("adopted claim = %+v, want its vfio record compacted", c)
	}
	data, err := encode(testdataBootID, st)
	if err != nil {
		t.Fatal(err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(file)); err != nil {
		t.Fatal(err)
	}
	if string(data) != compact.String()+"\n" {
		t.Errorf("re-encoded\n%s\nwant\n%s", data, compact.String())
	}
}

// TestPoollessDeviceConflicts is the regression test of a chaos-run
// finding: devices recorded without a pool (the v2 file's claim
// c9d8e7f6...) let the conflict check (pool and name) give a second claim
// the GPU such a claim held, and kept that claim from being prepared again
// ("already prepared with devices [/gpu-3], not [node-1/gpu-3]"). With
// WithPool they get the node's pool when read.
func TestPoollessDeviceConflicts(t *testing.T) {
	const holder = "c9d8e7f6-1a2b-4c3d-9e8f-0a1b2c3d4e5f"
	second := claimstate.Intent{UID: "second", Namespace: "other", Name: "wants-gpu-3",
		Devices: []claimstate.Device{{Requests: []string{"gpu"}, Pool: "node-1", Name: "gpu-3"}}}
	again := claimstate.Intent{UID: holder, Namespace: "ci", Name: "migrated-from-v1",
		Devices: []claimstate.Device{{Pool: "node-1", Name: "gpu-3"}}}

	e, s, report := openTestdata(t, "v2.json", WithPool("node-1"))
	if report != (OpenReport{}) {
		t.Errorf("report = %+v, want zero", report)
	}
	st := mustRead(t, s)
	for uid, c := range st.Claims {
		for _, d := range c.Devices {
			if d.Pool != "node-1" {
				t.Errorf("claim %s device %s has pool %q, want node-1", uid, d.Name, d.Pool)
			}
		}
	}
	var conflict *claimstate.ConflictError
	if _, _, err := st.PlanPrepare(second); !errors.As(err, &conflict) || conflict.Holder.UID != holder {
		t.Errorf("PlanPrepare of a second claim for gpu-3 = %v, want a ConflictError naming %s", err, holder)
	}
	if action, existing, err := st.PlanPrepare(again); err != nil || action != claimstate.ActionReturnRecorded || existing == nil {
		t.Errorf("PlanPrepare of the holder again = %v, %v, want ReturnRecorded", action, err)
	}
	// The pool is in the file now, and an Update cannot take it away.
	if d, err := testSchema.decode([]byte(readFile(t, e.path()))); err != nil || d.state.Claims[holder].Devices[0].Pool != "node-1" {
		t.Errorf("file after Open: err %v, devices %+v", err, d.state.Claims[holder])
	}
	err := s.Update(t.Context(), addClaim(&claimstate.Claim{UID: "nopool", Phase: claimstate.PrepareCompleted, Devices: []claimstate.Device{{Name: "gpu-7"}}}))
	if err == nil || !strings.Contains(err.Error(), `device "gpu-7" has no pool`) {
		t.Errorf("Update with a device without a pool = %v, want it refused", err)
	}

	// Without the pool, as before the fix: the defect.
	_, s2, _ := openTestdata(t, "v2.json")
	st2 := mustRead(t, s2)
	if _, _, err := st2.PlanPrepare(second); err != nil {
		t.Errorf("without WithPool PlanPrepare = %v; the defect this test guards against is gone, update the test", err)
	}
}
