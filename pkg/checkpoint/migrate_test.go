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

	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// testdataBootID is the boot ID of the v2-v5 files in testdata.
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
		// Migrated from v1 by an earlier release: no pool.
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

func TestMigrateV3(t *testing.T) {
	const parent = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
	mig := claimstate.Device{Requests: []string{"mig"}, Pool: "node-1", Name: "gpu-1-mig-1g10gb-19-0",
		UUID: "MIG-11111111-2222-3333-4444-555555555555", ParentUUID: parent}
	migA, migB := mig, mig
	migA.ShareID, migA.CDIDeviceIDs = "share-a", []string{"k8s.gpu.nvidia.com/claim=11111111-aaaa-4aaa-8aaa-000000000001-mig-a"}
	migB.ShareID, migB.CDIDeviceIDs = "share-b", []string{"k8s.gpu.nvidia.com/claim=11111111-aaaa-4aaa-8aaa-000000000001-mig-b"}
	want := &claimstate.State{Claims: map[string]*claimstate.Claim{
		"11111111-aaaa-4aaa-8aaa-000000000001": {
			UID: "11111111-aaaa-4aaa-8aaa-000000000001", Namespace: "ml-team", Name: "mig-pair",
			Phase:     claimstate.PrepareCompleted,
			StartedAt: time.Date(2026, 11, 22, 10, 30, 0, 0, time.UTC),
			Consumers: []claimstate.Consumer{{Name: "trainer-0", UID: "0a1b2c3d-4e5f-4a6b-8c7d-000000000001"}},
			Devices: []claimstate.Device{migA, migB, {Requests: []string{"big"}, Pool: "node-1", Name: "gpu-1-mig-2g20gb-14-2",
				UUID: "MIG-22222222-3333-4444-5555-666666666666", ParentUUID: parent}},
			// One entry per device name, in device order; giID and ciID
			// omitted when 0, as v3 wrote them.
			Records: map[string]json.RawMessage{recordDynamicMIG: json.RawMessage(`{"devices":[` +
				`{"device":"gpu-1-mig-1g10gb-19-0","parentUUID":"` + parent + `","profile":"1g.10gb","profileID":19,"start":0,"size":1,"uuid":"MIG-11111111-2222-3333-4444-555555555555","giID":7},` +
				`{"device":"gpu-1-mig-2g20gb-14-2","parentUUID":"` + parent + `","profile":"2g.20gb","profileID":14,"start":2,"size":2,"uuid":"MIG-22222222-3333-4444-5555-666666666666","giID":3,"ciID":1}]}`)},
		},
		"11111111-aaaa-4aaa-8aaa-000000000002": {
			UID: "11111111-aaaa-4aaa-8aaa-000000000002", Namespace: "ml-team", Name: "mig-started",
			Phase:     claimstate.PrepareStarted,
			StartedAt: time.Date(2026, 11, 22, 10, 35, 0, 0, time.UTC),
			Devices: []claimstate.Device{{Requests: []string{"mig"}, Pool: "node-1", Name: "gpu-2-mig-1g10gb-19-4",
				ParentUUID: "GPU-bbbbbbbb-cccc-dddd-eeee-ffffffffffff"}},
			// Not created yet: no uuid, giID or ciID.
			Records: map[string]json.RawMessage{recordDynamicMIG: json.RawMessage(`{"devices":[` +
				`{"device":"gpu-2-mig-1g10gb-19-4","parentUUID":"GPU-bbbbbbbb-cccc-dddd-eeee-ffffffffffff","profile":"1g.10gb","profileID":19,"start":4,"size":1}]}`)},
		},
		"11111111-aaaa-4aaa-8aaa-000000000003": {
			UID: "11111111-aaaa-4aaa-8aaa-000000000003", Namespace: "default", Name: "plain",
			Phase:     claimstate.PrepareCompleted,
			StartedAt: time.Date(2026, 11, 22, 10, 36, 0, 0, time.UTC),
			Devices: []claimstate.Device{{Requests: []string{"gpu"}, Pool: "node-1", Name: "gpu-0",
				UUID: "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"}},
		},
	}}
	assertMigrated(t, "v3.json", versionV3, want, "dynamicMIG")
}

func TestMigrateV4(t *testing.T) {
	_, s, _ := openTestdata(t, "v4.json")
	got := mustRead(t, s)
	wantRecords := map[string]map[string]string{
		"22222222-bbbb-4bbb-8bbb-000000000001": {
			recordTimeSlicing: `{"gpus":[{"device":"gpu-0","gpu":"GPU-00000000-0000-4000-8000-000000000000","interval":"Long"},` +
				`{"device":"gpu-1","gpu":"GPU-11111111-1111-4111-8111-111111111111","interval":"Short"}]}`,
		},
		"22222222-bbbb-4bbb-8bbb-000000000002": {
			// Grouped by daemon in first-seen order, device names once each.
			recordMPS:         `{"daemons":[{"id":"daemon-a","devices":["gpu-2","gpu-4"]},{"id":"daemon-b","devices":["gpu-3"]}]}`,
			recordTimeSlicing: `{"gpus":[{"device":"gpu-3","gpu":"GPU-33333333-3333-4333-8333-333333333333","interval":"Medium"}]}`,
		},
		"22222222-bbbb-4bbb-8bbb-000000000003": {
			recordVFIO: `{"devices":[{"device":"gpu-vfio-5","gpu":"0000:1b:00.0","iommuGroup":20,"functions":[` +
				`{"busID":"0000:1b:00.0","driver":"vfio-pci","originalDriver":"nvidia"},` +
				`{"busID":"0000:1b:00.1","driver":"vfio-pci","originalDriver":"snd_hda_intel","originalDriverOverride":"snd_hda_intel"},` +
				`{"busID":"0000:1b:00.2","driver":"vfio-pci"}]}]}`,
		},
		"22222222-bbbb-4bbb-8bbb-000000000004": {
			recordDynamicMIG: `{"devices":[{"device":"gpu-6-mig-3g40gb-9-4","parentUUID":"GPU-66666666-6666-4666-8666-666666666666",` +
				`"profile":"3g.40gb","profileID":9,"start":4,"size":4,"uuid":"MIG-66666666-7777-8888-9999-000000000000","giID":2}]}`,
		},
	}
	wantDevices := map[string][]string{
		"22222222-bbbb-4bbb-8bbb-000000000001": {"node-1/gpu-0@share-0 GPU-00000000-0000-4000-8000-000000000000", "node-1/gpu-1@share-1 GPU-11111111-1111-4111-8111-111111111111"},
		"22222222-bbbb-4bbb-8bbb-000000000002": {"node-1/gpu-2@share-a GPU-22222222-2222-4222-8222-222222222222", "node-1/gpu-3 GPU-33333333-3333-4333-8333-333333333333",
			"node-1/gpu-2@share-b GPU-22222222-2222-4222-8222-222222222222", "node-1/gpu-4 GPU-44444444-4444-4444-8444-444444444444"},
		"22222222-bbbb-4bbb-8bbb-000000000003": {"node-1/gpu-vfio-5 GPU-55555555-5555-4555-8555-555555555555"},
		"22222222-bbbb-4bbb-8bbb-000000000004": {"node-1/gpu-6-mig-3g40gb-9-4 MIG-66666666-7777-8888-9999-000000000000"},
	}
	if len(got.Claims) != len(wantRecords) {
		t.Errorf("%d claims, want %d", len(got.Claims), len(wantRecords))
	}
	for uid, records := range wantRecords {
		c := got.Claims[uid]
		if c == nil {
			t.Errorf("claim %s missing", uid)
			continue
		}
		gotRecords := map[string]string{}
		for name, rec := range c.Records {
			gotRecords[name] = string(rec)
		}
		if !reflect.DeepEqual(gotRecords, records) {
			t.Errorf("claim %s records:\n%v\nwant\n%v", uid, gotRecords, records)
		}
		var devices []string
		for _, d := range c.Devices {
			key := d.Pool + "/" + d.Name
			if d.ShareID != "" {
				key += "@" + d.ShareID
			}
			devices = append(devices, key+" "+d.UUID)
		}
		if !reflect.DeepEqual(devices, wantDevices[uid]) {
			t.Errorf("claim %s devices %v, want %v", uid, devices, wantDevices[uid])
		}
	}
	if c := got.Claims["22222222-bbbb-4bbb-8bbb-000000000004"]; c == nil || !c.Adopted {
		t.Errorf("adopted claim = %+v, want Adopted", c)
	}
	assertMigrated(t, "v4.json", versionV4, got, "dynamicMIG,mps,timeSlicing,vfio")
}

// assertMigrated checks that testdata/name migrates to want, is written
// back as v5 at Open and then read as it is, and is left alone by a Store
// that does not know the records it needs (unknown).
func assertMigrated(t *testing.T, name, from string, want *claimstate.State, unknown string) {
	t.Helper()
	e, s, report := openTestdata(t, name)
	if report != (OpenReport{Migrated: from}) {
		t.Errorf("report = %+v, want Migrated %s only", report, from)
	}
	if got := mustRead(t, s); !reflect.DeepEqual(got, want) {
		t.Errorf("migrated state = %s\nwant %s", dump(got), dump(want))
	}
	written := readFile(t, e.path())
	if wantPrefix := `{"version":"v5","bootID":"` + testdataBootID + `","requires":["` + strings.ReplaceAll(unknown, ",", `","`) + `"],`; !strings.HasPrefix(written, wantPrefix) {
		t.Errorf("file after migration = %s, want it to begin %s", written, wantPrefix)
	}
	_ = s.Close()
	s2, report := e.open(t)
	if report != (OpenReport{}) {
		t.Errorf("second Open report = %+v, want zero", report)
	}
	if got := mustRead(t, s2); !reflect.DeepEqual(got, want) {
		t.Errorf("state after reopen = %s\nwant %s", dump(got), dump(want))
	}

	// A reader without the records: left alone, like a newer version.
	orig := readFile(t, filepath.Join("testdata", name))
	e2 := newTestEnv(t)
	e2.setBootID(t, testdataBootID)
	e2.writeCheckpoint(t, orig, false)
	_, ctx := ktesting.NewTestContext(t)
	s3, report, err := Open(ctx, e2.dir, WithBootIDPath(e2.bootIDPath), WithProcStatPath(e2.statPath))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s3.Close() }()
	if report != (OpenReport{NewerVersion: from, UnknownRecords: unknown}) {
		t.Errorf("report without known records = %+v, want NewerVersion %s, UnknownRecords %s", report, from, unknown)
	}
	if err := s3.Update(t.Context(), addClaim(testClaim("x"))); !errors.Is(err, ErrNewerVersion) || !strings.Contains(err.Error(), strings.Split(unknown, ",")[0]) {
		t.Errorf("Update without known records = %v, want ErrNewerVersion naming %s", err, unknown)
	}
	if got := readFile(t, e2.path()); got != orig {
		t.Errorf("file without known records changed to %s", got)
	}
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

// TestMigratedV1PoolConflicts is the regression test of a chaos-run
// finding: devices migrated from v1 had no pool, so the conflict check
// (pool and name) let a second claim have a GPU a migrated claim held, and
// the migrated claim could not be prepared again ("already prepared with
// devices [/gpu-0], not [node/gpu-0]").
func TestMigratedV1PoolConflicts(t *testing.T) {
	const holder = "5f0c9a38-2d7e-4b1a-9c61-0e8a7f3b2c10"
	second := claimstate.Intent{UID: "second", Namespace: "other", Name: "wants-gpu-0",
		Devices: []claimstate.Device{{Requests: []string{"gpu"}, Pool: "node-1", Name: "gpu-0"}}}
	again := claimstate.Intent{UID: holder, Namespace: "ml-team", Name: "trainer-gpus",
		Devices: []claimstate.Device{{Requests: []string{"gpus"}, Pool: "node-1", Name: "gpu-0"}, {Requests: []string{"gpus"}, Pool: "node-1", Name: "gpu-1"}}}
	v1 := readFile(t, filepath.Join("testdata", "v1.json"))

	e := newTestEnv(t)
	e.writeCheckpoint(t, v1, false)
	s, report := e.open(t, WithPool("node-1"))
	if report != (OpenReport{Migrated: "v1"}) {
		t.Errorf("report = %+v, want Migrated v1 only", report)
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
		t.Errorf("PlanPrepare of a second claim for gpu-0 = %v, want a ConflictError naming %s", err, holder)
	}
	if action, existing, err := st.PlanPrepare(again); err != nil || action != claimstate.ActionReturnRecorded || existing == nil {
		t.Errorf("PlanPrepare of the migrated claim again = %v, %v, want ReturnRecorded", action, err)
	}
	// The pool is in the file now, and an Update cannot take it away.
	if d, err := testSchema.decode([]byte(readFile(t, e.path()))); err != nil || d.state.Claims[holder].Devices[0].Pool != "node-1" {
		t.Errorf("file after migration: err %v, devices %+v", err, d.state.Claims[holder])
	}
	err := s.Update(t.Context(), addClaim(&claimstate.Claim{UID: "nopool", Phase: claimstate.PrepareCompleted, Devices: []claimstate.Device{{Name: "gpu-7"}}}))
	if err == nil || !strings.Contains(err.Error(), `device "gpu-7" has no pool`) {
		t.Errorf("Update with a device without a pool = %v, want it refused", err)
	}

	// Without the pool, as before the fix: the defect.
	e2 := newTestEnv(t)
	e2.writeCheckpoint(t, v1, false)
	s2, _ := e2.open(t)
	st2 := mustRead(t, s2)
	if _, _, err := st2.PlanPrepare(second); err != nil {
		t.Errorf("without WithPool PlanPrepare = %v; the defect this test guards against is gone, update the test", err)
	}
}
