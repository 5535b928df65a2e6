package checkpoint

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

func readNVIDIAFixture(t testing.TB, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "nvidia", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestAdoptNVIDIA opens a directory holding a checkpoint of NVIDIA's DRA
// driver, as its code writes it, and checks what gpudra makes of it.
func TestAdoptNVIDIA(t *testing.T) {
	e := newTestEnv(t)
	e.setBootID(t, nvTestBootID)
	original := readNVIDIAFixture(t, "v2-gpus.json")
	e.writeCheckpoint(t, original, false)
	s, report := e.open(t, WithPool(nvNode))

	if report.Corrupt != nil || report.NewerVersion != "" || report.BootIDChanged {
		t.Fatalf("report = %+v, want a plain adoption", report)
	}
	if report.Migrated != NVIDIAv2 || report.NVIDIA == nil {
		t.Fatalf("report = %+v, want Migrated %s and NVIDIA set", report, NVIDIAv2)
	}
	if n := report.NVIDIA; n.Claims != 2 || n.Started != 1 || n.Skipped != 1 || n.Format != NVIDIAv2 {
		t.Errorf("NVIDIA = %+v, want 2 claims (1 started), 1 skipped", *n)
	}
	kept, err := os.ReadFile(report.NVIDIA.KeptAt)
	if err != nil || string(kept) != original {
		t.Errorf("kept copy %s: %v; equal to the original: %v", report.NVIDIA.KeptAt, err, string(kept) == original)
	}
	if !strings.HasPrefix(filepath.Base(report.NVIDIA.KeptAt), FileName+".nvidia-") {
		t.Errorf("kept at %s, want %s.nvidia-<time>", report.NVIDIA.KeptAt, FileName)
	}
	onDisk, err := os.ReadFile(e.path())
	if err != nil || !strings.Contains(string(onDisk), `"bootID":"`+nvTestBootID+`"`) {
		t.Fatalf("checkpoint.json not rewritten in gpudra's format: %v: %s", err, onDisk)
	}

	st := mustRead(t, s)
	gpus := st.Claims[nvClaimGPUs]
	if gpus == nil || gpus.Phase != claimstate.PrepareCompleted || gpus.Adopted {
		t.Fatalf("claim %s = %+v, want completed", nvClaimGPUs, gpus)
	}
	if len(gpus.Consumers) != 1 || gpus.Consumers[0].Name != "trainer-0" {
		t.Errorf("consumers = %+v, want trainer-0 from reservedFor", gpus.Consumers)
	}
	want := []claimstate.Device{
		{Requests: []string{"gpus"}, Pool: nvNode, Name: "gpu-0", UUID: nvGPU0UUID, CDIDeviceIDs: []string{"k8s.gpu.nvidia.com/claim=" + nvClaimGPUs + "-gpu-0"}},
		{Requests: []string{"gpus"}, Pool: nvNode, Name: "gpu-1", UUID: nvGPU1UUID, CDIDeviceIDs: []string{"k8s.gpu.nvidia.com/claim=" + nvClaimGPUs + "-gpu-1"}},
	}
	assertDevices(t, gpus.Devices, want)

	started := st.Claims[nvClaimStarted]
	if started == nil || started.Phase != claimstate.PrepareStarted || started.Name != "half-done" || started.Namespace != "ml-team" {
		t.Fatalf("claim %s = %+v, want started ml-team/half-done", nvClaimStarted, started)
	}
	assertDevices(t, started.Devices, []claimstate.Device{{Requests: []string{"gpu"}, Pool: nvNode, Name: "gpu-2"}})
	if st.Claims[nvClaimEmpty] != nil {
		t.Errorf("a started claim without devices was adopted")
	}

	// The adopted GPUs are held: another claim cannot have them.
	err = s.Update(t.Context(), func(st *claimstate.State) error {
		return st.RecordStarted(claimstate.Intent{UID: "other", Devices: []claimstate.Device{{Pool: nvNode, Name: "gpu-1", UUID: nvGPU1UUID}}}, e.bootTime)
	})
	var conflict *claimstate.ConflictError
	if !errors.As(err, &conflict) || conflict.Holder.UID != nvClaimGPUs {
		t.Errorf("second claim on gpu-1: %v, want a conflict with %s", err, nvClaimGPUs)
	}

	// A second Open reads gpudra's file: nothing is adopted twice.
	_ = s.Close()
	_, again := e.open(t, WithPool(nvNode))
	if again.NVIDIA != nil || again.Migrated != "" {
		t.Errorf("second open: %+v, want gpudra's own file", again)
	}
}

func assertDevices(t *testing.T, got, want []claimstate.Device) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("devices = %+v, want %+v", got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if strings.Join(g.Requests, ",") != strings.Join(w.Requests, ",") || g.Pool != w.Pool || g.Name != w.Name ||
			g.UUID != w.UUID || g.ParentUUID != w.ParentUUID || g.ShareID != w.ShareID || g.AdminAccess != w.AdminAccess ||
			strings.Join(g.CDIDeviceIDs, ",") != strings.Join(w.CDIDeviceIDs, ",") {
			t.Errorf("device %d = %+v, want %+v", i, g, w)
		}
	}
}

// TestAdoptNVIDIAFormats covers the other fixtures: a MIG device, a file of
// a release with only the v1 section, a file of a previous boot, and one
// whose checksum does not hold.
func TestAdoptNVIDIAFormats(t *testing.T) {
	for _, tc := range []struct {
		name, file   string
		bootID       string
		previousBoot bool
		wantFormat   string
		wantClaims   map[string][]claimstate.Device
		wantReset    bool
		wantCorrupt  string
		// damage, if set, changes the file's content before it is opened.
		damage func(string) string
	}{
		{
			name: "static MIG, no boot ID recorded", file: "v2-mig.json", bootID: "boot-a", wantFormat: NVIDIAv2,
			wantClaims: map[string][]claimstate.Device{nvClaimMIG: {{Requests: []string{"mig"}, Pool: nvNode, Name: nvMIGDeviceName,
				UUID: nvMIGUUID, ParentUUID: nvGPU2UUID, CDIDeviceIDs: []string{"k8s.gpu.nvidia.com/claim=" + nvClaimMIG + "-" + nvMIGDeviceName}}}},
		},
		{
			name: "v1 section only (older releases)", file: "v1-legacy.json", bootID: "boot-a", wantFormat: NVIDIAv1,
			wantClaims: map[string][]claimstate.Device{nvClaimGPUs: {
				{Requests: []string{"gpus"}, Pool: nvNode, Name: "gpu-0", UUID: nvGPU0UUID, CDIDeviceIDs: []string{"k8s.gpu.nvidia.com/claim=" + nvClaimGPUs + "-gpu-0"}},
				{Requests: []string{"gpus"}, Pool: nvNode, Name: "gpu-1", UUID: nvGPU1UUID, CDIDeviceIDs: []string{"k8s.gpu.nvidia.com/claim=" + nvClaimGPUs + "-gpu-1"}},
			}},
		},
		{name: "recorded boot is another", file: "v2-gpus.json", bootID: "boot-b", wantFormat: NVIDIAv2, wantReset: true},
		{name: "no boot recorded, file older than the boot", file: "v2-mig.json", bootID: "boot-a", previousBoot: true, wantFormat: NVIDIAv2, wantReset: true},
		{name: "checksum does not hold", file: "v2-bad-checksum.json", bootID: nvTestBootID, wantCorrupt: "NVIDIA DRA driver checkpoint: checksum"},
		{
			name: "cut short", file: "v2-gpus.json", bootID: nvTestBootID, damage: func(s string) string { return s[:len(s)/2] },
			wantCorrupt: "NVIDIA DRA driver checkpoint: not whole JSON (cut short or damaged), so its checksums cannot be verified: unexpected end of JSON input",
		},
		{
			name: "cut short, without a version", file: "v2-shares.json", bootID: nvTestBootID, damage: func(s string) string { return s[:100] },
			wantCorrupt: "NVIDIA DRA driver checkpoint: not whole JSON",
		},
		{
			name: "damaged", file: "v2-gpus.json", bootID: nvTestBootID, damage: func(s string) string { return strings.Replace(s, `"v2":{`, `"v2":{{`, 1) },
			wantCorrupt: "NVIDIA DRA driver checkpoint: not whole JSON (cut short or damaged), so its checksums cannot be verified: invalid character",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEnv(t)
			e.setBootID(t, tc.bootID)
			content := readNVIDIAFixture(t, tc.file)
			if tc.damage != nil {
				content = tc.damage(content)
			}
			e.writeCheckpoint(t, content, tc.previousBoot)
			s, report := e.open(t, WithPool(nvNode))
			if tc.wantCorrupt != "" {
				if report.Corrupt == nil || !strings.Contains(report.Corrupt.Err.Error(), tc.wantCorrupt) {
					t.Fatalf("report = %+v, want Corrupt %q", report, tc.wantCorrupt)
				}
				if !errors.Is(report.Corrupt.Err, ErrNVIDIACheckpoint) {
					t.Errorf("Corrupt.Err = %v, does not match ErrNVIDIACheckpoint", report.Corrupt.Err)
				}
				if _, err := os.Stat(report.Corrupt.Path); err != nil {
					t.Errorf("moved-aside file: %v", err)
				}
				if !s.NeedsAdoption() {
					t.Errorf("a corrupt NVIDIA file of this boot must make the Store need adoption")
				}
				return
			}
			if report.NVIDIA == nil || report.Migrated != tc.wantFormat || report.BootIDChanged != tc.wantReset {
				t.Fatalf("report = %+v (NVIDIA %+v), want format %s, boot reset %v", report, report.NVIDIA, tc.wantFormat, tc.wantReset)
			}
			if _, err := os.Stat(report.NVIDIA.KeptAt); err != nil {
				t.Errorf("kept copy: %v", err)
			}
			st := mustRead(t, s)
			if len(st.Claims) != len(tc.wantClaims) {
				t.Fatalf("claims = %d, want %d", len(st.Claims), len(tc.wantClaims))
			}
			for uid, want := range tc.wantClaims {
				c := st.Claims[uid]
				if c == nil || c.Phase != claimstate.PrepareCompleted {
					t.Fatalf("claim %s = %+v, want completed", uid, c)
				}
				assertDevices(t, c.Devices, want)
			}
		})
	}
}

// TestNVIDIAUnknownVersion: a later NVIDIA format is left alone, like a
// newer gpudra version.
func TestNVIDIAUnknownVersion(t *testing.T) {
	e := newTestEnv(t)
	content := strings.Replace(readNVIDIAFixture(t, "v2-mig.json"), `{"version":"v2"`, `{"version":"v3"`, 1)
	e.writeCheckpoint(t, content, false)
	_, report := e.open(t, WithPool(nvNode))
	if report.NewerVersion != "NVIDIA v3" {
		t.Fatalf("report = %+v, want NewerVersion NVIDIA v3", report)
	}
	if got, _ := os.ReadFile(e.path()); string(got) != content {
		t.Errorf("the file was changed")
	}
}

// sealNVIDIA assembles a file of NVIDIA's current layout around the two
// sections, with checksums that hold, so that the fuzzer reaches the
// conversion instead of stopping at the checksum. v2 must be a compact JSON
// object starting with its checksum field for its checksum to be set.
func sealNVIDIA(v1, v2 []byte) []byte {
	view := []byte(`{"checksum":0,"v1":` + string(v1) + `}`)
	out := []byte(`{"version":"v2","checksum":` + strconv.FormatUint(KubeletChecksum(view), 10) + `,"v1":` + string(v1))
	if zeroed, ok := zeroChecksum(v2, false); ok {
		v2 = append([]byte(`{"checksum":`+strconv.FormatUint(KubeletChecksum(zeroed), 10)), zeroed[len(`{"checksum":0`):]...)
	}
	return append(append(append(out, `,"v2":`...), v2...), '}')
}

// FuzzDecodeNVIDIA feeds NVIDIA-layout files, sealed with valid checksums,
// and the same bytes unsealed, to the decoder: it must never panic, and
// whatever it accepts must be a state gpudra writes and reads back
// unchanged.
func FuzzDecodeNVIDIA(f *testing.F) {
	for _, name := range []string{"v2-gpus.json", "v2-mig.json", "v1-legacy.json", "v2-shares.json"} {
		var file struct{ V1, V2 json.RawMessage }
		data := []byte(readNVIDIAFixture(f, name))
		if err := json.Unmarshal(data, &file); err != nil {
			f.Fatal(err)
		}
		if len(file.V2) == 0 {
			file.V2 = json.RawMessage(`null`)
		}
		f.Add([]byte(file.V1), []byte(file.V2))
	}
	f.Add([]byte(`{}`), []byte(`{"checksum":0,"preparedClaims":{"a":{"checkpointState":"PrepareCompleted","preparedDevices":[{"devices":[{"gpu":{"info":null,"device":{"DeviceName":"gpu-0"}},"mig":{}}]}]}}}`))
	f.Add([]byte(`{"preparedClaims":{"a":null}}`), []byte(`null`))
	f.Add([]byte(`null`), []byte(`{"checksum":0,"preparedClaims":{"a":{"checkpointState":"PrepareStarted","status":{"allocation":{"devices":{"results":[{"driver":"gpu.nvidia.com","device":""}]}}}}}}`))
	f.Fuzz(func(t *testing.T, v1, v2 []byte) {
		for _, data := range [][]byte{sealNVIDIA(v1, v2), v2} {
			for _, sc := range fuzzSchemas {
				d, err := sc.decode(data)
				if err != nil {
					if err.Error() == "" {
						t.Fatalf("decode error without a message")
					}
					continue
				}
				if d.nvidia == nil {
					continue // not in NVIDIA's layout: FuzzDecode's business
				}
				if d.from != NVIDIAv1 && d.from != NVIDIAv2 {
					t.Fatalf("NVIDIA file read as %q", d.from)
				}
				if err := sc.validate(d.state); err != nil {
					t.Fatalf("decode accepted an invalid state: %v", err)
				}
				for uid, c := range d.state.Claims {
					if len(c.Devices) == 0 && c.Phase == claimstate.PrepareStarted {
						t.Fatalf("claim %s: started without devices was adopted", uid)
					}
				}
				roundTrip(t, sc, d.state, "adopted from NVIDIA")
			}
		}
	})
}

// TestAdoptNVIDIAShares opens a file of an NVIDIA release without a
// top-level version, holding shares of GPUs allocated with consumable
// capacity, whose share IDs only the allocation results record: each
// adopted device carries its share, so that the kubelet's next Prepare of
// the claim matches the record and the shares hold their GPU together,
// not exclusively.
func TestAdoptNVIDIAShares(t *testing.T) {
	e := newTestEnv(t)
	e.setBootID(t, nvTestBootID)
	original := readNVIDIAFixture(t, "v2-shares.json")
	if strings.Contains(original, `"version"`) {
		t.Fatal("v2-shares.json has a top-level version; NVIDIA's releases before main wrote none")
	}
	e.writeCheckpoint(t, original, false)
	s, report := e.open(t, WithPool(nvNode))
	if report.Corrupt != nil || report.Migrated != NVIDIAv2 || report.NVIDIA == nil || report.NVIDIA.Claims != 3 {
		t.Fatalf("report = %+v (NVIDIA %+v), want 3 claims adopted from %s", report, report.NVIDIA, NVIDIAv2)
	}
	st := mustRead(t, s)
	cdiID := func(uid, device string) []string { return []string{"k8s.gpu.nvidia.com/claim=" + uid + "-" + device} }
	assertDevices(t, st.Claims[nvClaimShareA].Devices, []claimstate.Device{
		{Requests: []string{"gpu"}, Pool: nvNode, Name: "gpu-0", ShareID: nvShareA, UUID: nvGPU0UUID, CDIDeviceIDs: cdiID(nvClaimShareA, "gpu-0")}})
	assertDevices(t, st.Claims[nvClaimShareB].Devices, []claimstate.Device{
		{Requests: []string{"inference"}, Pool: nvNode, Name: "gpu-0", ShareID: nvShareB, UUID: nvGPU0UUID, CDIDeviceIDs: cdiID(nvClaimShareB, "gpu-0")}})
	assertDevices(t, st.Claims[nvClaimShareStarted].Devices, []claimstate.Device{
		{Requests: []string{"gpu"}, Pool: nvNode, Name: "gpu-1", ShareID: nvShareStarted}})

	for _, tc := range []struct {
		name       string
		in         claimstate.Intent
		wantAction claimstate.PrepareAction
		wantErr    string
	}{
		{
			name:       "the kubelet prepares an adopted share again",
			in:         claimstate.Intent{UID: nvClaimShareA, Devices: []claimstate.Device{{Requests: []string{"gpu"}, Pool: nvNode, Name: "gpu-0", ShareID: nvShareA}}},
			wantAction: claimstate.ActionReturnRecorded,
		},
		{
			name:       "a new share of the shared GPU",
			in:         claimstate.Intent{UID: "new-share", Devices: []claimstate.Device{{Requests: []string{"gpu"}, Pool: nvNode, Name: "gpu-0", ShareID: "5a0e3c1f-8b2d-4e6a-9f70-000000000009"}}},
			wantAction: claimstate.ActionPrepare,
		},
		{
			name:    "the shared GPU whole",
			in:      claimstate.Intent{UID: "whole", Devices: []claimstate.Device{{Requests: []string{"gpu"}, Pool: nvNode, Name: "gpu-0"}}},
			wantErr: "already prepared for claim",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var action claimstate.PrepareAction
			err := s.View(t.Context(), func(st *claimstate.State) error {
				var err error
				action, _, err = st.PlanPrepare(tc.in)
				return err
			})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("PlanPrepare: %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || action != tc.wantAction {
				t.Fatalf("PlanPrepare = %v, %v; want %v", action, err, tc.wantAction)
			}
		})
	}
}

// TestNVIDIAStartedClaimGetsRetryWindow: a claim NVIDIA's driver only
// started is adopted as started at the adoption, so the sweep leaves it to
// the kubelet's retry for the call timeout and rolls it back only after.
func TestNVIDIAStartedClaimGetsRetryWindow(t *testing.T) {
	const callTimeout = 2 * time.Minute
	adoptedAt := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		file, started string
	}{
		{file: "v2-gpus.json", started: nvClaimStarted},
		{file: "v2-shares.json", started: nvClaimShareStarted},
	} {
		t.Run(tc.file, func(t *testing.T) {
			e := newTestEnv(t)
			e.setBootID(t, nvTestBootID)
			e.writeCheckpoint(t, readNVIDIAFixture(t, tc.file), false)
			s, report := e.open(t, WithPool(nvNode), WithClock(func() time.Time { return adoptedAt }))
			if report.NVIDIA == nil || report.NVIDIA.Started != 1 {
				t.Fatalf("report = %+v (NVIDIA %+v), want one started claim adopted", report, report.NVIDIA)
			}
			st := mustRead(t, s)
			c := st.Claims[tc.started]
			if c == nil || c.Phase != claimstate.PrepareStarted || !c.StartedAt.Equal(adoptedAt) {
				t.Fatalf("claim %s = %+v, want started at the adoption, %s", tc.started, c, adoptedAt)
			}
			for uid, c := range st.Claims {
				if !c.StartedAt.Equal(adoptedAt) {
					t.Errorf("claim %s started at %s, want the adoption", uid, c.StartedAt)
				}
			}
			notGone := func(*claimstate.Claim) bool { return false }
			if plan := st.PlanSweep(adoptedAt.Add(callTimeout/2), callTimeout, notGone); len(plan.RollBack) != 0 {
				t.Errorf("a sweep within the call timeout rolls back %d claims, want none", len(plan.RollBack))
			}
			plan := st.PlanSweep(adoptedAt.Add(callTimeout+time.Second), callTimeout, notGone)
			if len(plan.RollBack) != 1 || plan.RollBack[0].UID != tc.started {
				t.Errorf("a sweep after the call timeout rolls back %+v, want %s", plan.RollBack, tc.started)
			}
		})
	}
}

// TestTruncatedFileOwner: a file cut short is reported as NVIDIA's only
// when it starts as NVIDIA's driver writes its file.
func TestTruncatedFileOwner(t *testing.T) {
	gpudraV2 := `{"version":"v2","bootID":"boot-a","claims":{"a":{"uid":"a","namespace":"ns","name":"c","phase":"PrepareCompleted"`
	for _, tc := range []struct {
		name, data string
		nvidia     bool
	}{
		{"NVIDIA's current layout", readNVIDIAFixture(t, "v2-gpus.json")[:300], true},
		{"NVIDIA's releases without a version", readNVIDIAFixture(t, "v2-shares.json")[:20], true},
		{"NVIDIA's v1-only releases", readNVIDIAFixture(t, "v1-legacy.json")[:12], true},
		{"gpudra v2", gpudraV2, false},
		{"empty", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := fuzzSchemas[0].decode([]byte(tc.data))
			if err == nil {
				t.Fatal("a file cut short was read")
			}
			if got := errors.Is(err, ErrNVIDIACheckpoint); got != tc.nvidia {
				t.Errorf("decode: %v; NVIDIA's: %v, want %v", err, got, tc.nvidia)
			}
		})
	}
}
