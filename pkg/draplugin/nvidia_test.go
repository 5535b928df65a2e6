package draplugin_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpudra/gpudra/internal/shorttemp"
)

// Replacing NVIDIA's DRA driver in place (issue 15): the plugin starts on
// a node where NVIDIA's driver prepared claims, from a checkpoint written
// the way NVIDIA's code writes it (pkg/checkpoint/testdata/nvidia, made by
// pkg/checkpoint's generator) and the CDI specs that driver leaves.

const (
	// The claims of v2-dgx-h100-0.json.
	nvPrepared = "a1b2c3d4-0000-4000-8000-000000000001" // gpu-0 and gpu-1, PrepareCompleted
	nvStarted  = "a1b2c3d4-0000-4000-8000-000000000002" // gpu-2, PrepareStarted
)

// nvidiaSpec is a claim spec as NVIDIA's driver writes it: YAML, named
// k8s.gpu.nvidia.com-claim_<uid>.yaml, one device per prepared device named
// <claim uid>-<device>.
func nvidiaSpec(uid string, minors ...int) string {
	var b strings.Builder
	b.WriteString("---\ncdiVersion: 0.5.0\nkind: k8s.gpu.nvidia.com/claim\ndevices:\n")
	for _, m := range minors {
		b.WriteString("- name: " + uid + "-gpu-" + itoa(m) + "\n  containerEdits:\n    deviceNodes:\n" +
			"    - path: /dev/nvidia" + itoa(m) + "\n      type: c\n      major: 195\n      minor: " + itoa(m) + "\n")
	}
	b.WriteString("containerEdits:\n  env:\n  - NVIDIA_VISIBLE_DEVICES=void\n")
	return b.String()
}

// nvidiaNode is a directory as NVIDIA's driver leaves it on dgx-h100-0:
// its checkpoint, and the CDI spec of its prepared claim.
func nvidiaNode(t *testing.T, fixture string) (dir, original string) {
	t.Helper()
	dir = shorttemp.Dir(t)
	data, err := os.ReadFile(filepath.Join("..", "checkpoint", "testdata", "nvidia", fixture))
	if err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"plugin", "cdi"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "plugin", "checkpoint.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(dir, "cdi", "k8s.gpu.nvidia.com-claim_"+nvPrepared+".yaml")
	if err := os.WriteFile(spec, []byte(nvidiaSpec(nvPrepared, 0, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, string(data)
}

func TestAdoptNVIDIACheckpoint(t *testing.T) {
	dir, original := nvidiaNode(t, "v2-dgx-h100-0.json")
	h := newHarnessIn(t, dir)

	// One log line and one event say what was adopted; NVIDIA's file is
	// kept, gpudra's replaces it.
	msg, err := h.waitForEvent("NVIDIACheckpointAdopted")
	if err != nil || !strings.Contains(msg, "adopted 2 claims") || !strings.Contains(msg, "1 only started") {
		t.Errorf("event: %q, %v; want 2 claims adopted, 1 only started", msg, err)
	}
	if n := strings.Count(h.logs(), "Adopted the claims NVIDIA's DRA driver prepared on this node"); n != 1 {
		t.Errorf("adoption logged %d times, want once", n)
	}
	kept, _ := filepath.Glob(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json.nvidia-*"))
	if len(kept) != 1 {
		t.Fatalf("kept NVIDIA files: %v, want one", kept)
	}
	if data, _ := os.ReadFile(kept[0]); string(data) != original {
		t.Errorf("%s is not NVIDIA's original file", kept[0])
	}
	if cp := h.checkpoint(); !strings.Contains(cp, `"bootID":"boot-1"`) || !strings.Contains(cp, nvPrepared) {
		t.Errorf("checkpoint.json is not gpudra's with the adopted claims: %s", cp)
	}
	if corrupt := movedAsideCheckpoints(t, h); len(corrupt) != 0 {
		t.Errorf("NVIDIA's checkpoint was treated as corrupt: %v", corrupt)
	}
	nvSpec := "k8s.gpu.nvidia.com-claim_" + nvPrepared + ".yaml"
	if files := h.specFiles(); !slices.Contains(files, nvSpec) {
		t.Fatalf("NVIDIA's CDI spec was removed at start: %v", files)
	}

	// The kubelet prepares the claim again (a container restarts): the
	// same CDI IDs as NVIDIA's driver gave, and no spec of gpudra's that
	// would define its devices twice.
	prepared := h.create(&resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "trainer-gpus", UID: nvPrepared},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "gpus", Driver: driverName, Pool: nodeName, Device: "gpu-0"},
				{Request: "gpus", Driver: driverName, Pool: nodeName, Device: "gpu-1"},
			}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "trainer-0", UID: "0a1b2c3d-4e5f-4a6b-8c7d-000000000001"}},
		},
	})
	for range 2 {
		r := h.mustPrepare(prepared)
		var ids []string
		for _, d := range r.Devices {
			ids = append(ids, d.CdiDeviceIds...)
		}
		want := []string{"k8s.gpu.nvidia.com/claim=" + nvPrepared + "-gpu-0", "k8s.gpu.nvidia.com/claim=" + nvPrepared + "-gpu-1"}
		if !slices.Equal(ids, want) {
			t.Errorf("CDI IDs of the adopted claim = %v, want NVIDIA's %v", ids, want)
		}
	}
	if files := h.specFiles(); slices.Contains(files, "k8s.gpu.nvidia.com-claim_"+nvPrepared+".json") {
		t.Errorf("gpudra wrote a spec beside NVIDIA's: %v", files)
	}

	// Its GPUs go to no other claim.
	other := h.claim("gpu-1")
	if r := h.prepare(other).Claims[string(other.UID)]; r == nil || !strings.Contains(r.Error, nvPrepared) {
		t.Errorf("second claim on gpu-1: %+v, want refused naming %s", r, nvPrepared)
	}

	// The half-prepared claim: prepared again from scratch once the
	// kubelet retries it (gpudra rolls back what NVIDIA recorded first).
	started := h.claimFor("half-done", nvStarted, "gpu-2")
	h.mustPrepare(started)
	h.mustUnprepare(started)

	// Unprepare removes NVIDIA's spec and the record; the GPUs are free.
	h.mustUnprepare(prepared)
	if files := h.specFiles(); slices.Contains(files, nvSpec) {
		t.Errorf("NVIDIA's spec was not removed at Unprepare: %v", files)
	}
	if strings.Contains(h.checkpoint(), nvPrepared) {
		t.Errorf("the unprepared claim is still recorded")
	}
	h.serves("gpu-1")

	// A restart reads gpudra's own file: nothing is adopted twice.
	h.restart()
	if kept, _ := filepath.Glob(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json.nvidia-*")); len(kept) != 1 {
		t.Errorf("kept NVIDIA files after a restart: %v, want one", kept)
	}
}

// TestCorruptNVIDIACheckpoint: an NVIDIA checkpoint that cannot be read
// (its checksum does not hold, or it was cut short) is moved aside with a
// message that names it as NVIDIA's and says why; the claims whose YAML
// specs NVIDIA's driver left are adopted from them, so their GPUs go to no
// other claim and the kubelet's next Prepare gets NVIDIA's CDI IDs; the
// plugin serves the rest.
func TestCorruptNVIDIACheckpoint(t *testing.T) {
	for _, tc := range []struct {
		name    string
		damage  func(string) string
		wantErr string
	}{
		{
			name:    "checksum does not hold",
			damage:  func(s string) string { return strings.Replace(s, `"DeviceName":"gpu-1"`, `"DeviceName":"gpu-3"`, 1) },
			wantErr: "NVIDIA DRA driver checkpoint: checksum",
		},
		{
			name:    "cut short",
			damage:  func(s string) string { return s[:len(s)/3] },
			wantErr: "NVIDIA DRA driver checkpoint: not whole JSON (cut short or damaged)",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, original := nvidiaNode(t, "v2-dgx-h100-0.json")
			if err := os.WriteFile(filepath.Join(dir, "plugin", "checkpoint.json"), []byte(tc.damage(original)), 0o600); err != nil {
				t.Fatal(err)
			}
			h := newHarnessIn(t, dir)
			msg, err := h.waitForEvent("CheckpointUnreadable")
			if err != nil || !strings.HasPrefix(msg, "NVIDIA's DRA driver checkpoint") || !strings.Contains(msg, tc.wantErr) {
				t.Errorf("event: %q, %v; want NVIDIA's checkpoint named, and %q", msg, err, tc.wantErr)
			}
			if strings.Contains(msg, "gpudra checkpoint") {
				t.Errorf("event: %q calls NVIDIA's file gpudra's", msg)
			}
			if moved := movedAsideCheckpoints(t, h); len(moved) != 1 {
				t.Errorf("moved aside: %v, want one file", moved)
			}

			other := h.claim("gpu-1")
			if r := h.prepare(other).Claims[string(other.UID)]; r == nil || !strings.Contains(r.Error, nvPrepared) {
				t.Errorf("a claim on gpu-1 of NVIDIA's YAML spec: %+v, want refused naming %s", r, nvPrepared)
			}
			prepared := h.claimFor("trainer-gpus", nvPrepared, "gpu-0", "gpu-1")
			r := h.mustPrepare(prepared)
			var ids []string
			for _, d := range r.Devices {
				ids = append(ids, d.CdiDeviceIds...)
			}
			want := []string{"k8s.gpu.nvidia.com/claim=" + nvPrepared + "-gpu-0", "k8s.gpu.nvidia.com/claim=" + nvPrepared + "-gpu-1"}
			if !slices.Equal(ids, want) {
				t.Errorf("CDI IDs of the claim adopted from NVIDIA's spec = %v, want NVIDIA's %v", ids, want)
			}
			if files := h.specFiles(); slices.Contains(files, "k8s.gpu.nvidia.com-claim_"+nvPrepared+".json") {
				t.Errorf("gpudra wrote a spec beside NVIDIA's: %v", files)
			}
			h.serves("gpu-3")
			h.restart()
			h.serves("gpu-4")
		})
	}
}

// TestNVIDIAStartedClaimSurvivesFirstSweep: the sweep leaves a claim
// NVIDIA's driver only started to the kubelet's retry for the call
// timeout from the adoption: it still holds its GPU after a sweep at once.
func TestNVIDIAStartedClaimSurvivesFirstSweep(t *testing.T) {
	dir, _ := nvidiaNode(t, "v2-dgx-h100-0.json")
	h := newHarnessIn(t, dir)
	h.driver.Sweep(h.ctx)
	if !strings.Contains(h.checkpoint(), nvStarted) {
		t.Fatalf("the started claim was rolled back by the first sweep: %s", h.checkpoint())
	}
	other := h.claim("gpu-2")
	if r := h.prepare(other).Claims[string(other.UID)]; r == nil || !strings.Contains(r.Error, nvStarted) {
		t.Errorf("another claim on gpu-2: %+v, want refused naming %s", r, nvStarted)
	}
}

// TestNVIDIAClaimsAreNamedBySweep: NVIDIA's checkpoint drops a claim's
// name once it is prepared. The sweep finds the adopted claim by UID in one
// list of ResourceClaims and records its name, so that refusals name it
// and later sweeps GET it instead of listing every claim again.
func TestNVIDIAClaimsAreNamedBySweep(t *testing.T) {
	dir, _ := nvidiaNode(t, "v2-dgx-h100-0.json")
	h := newHarnessIn(t, dir)
	h.create(&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "trainer-gpus", UID: nvPrepared}})
	claimCalls := func(verb string) int {
		n := 0
		for _, a := range h.client.Actions() {
			if a.GetVerb() == verb && a.GetResource().Resource == "resourceclaims" {
				n++
			}
		}
		return n
	}
	for i, want := range []struct{ lists, gets int }{
		{lists: 1, gets: 1}, // named from the list, then asked about by name
		{lists: 0, gets: 1},
		{lists: 0, gets: 1},
	} {
		lists, gets := claimCalls("list"), claimCalls("get")
		h.driver.Sweep(h.ctx)
		if got := claimCalls("list") - lists; got != want.lists {
			t.Errorf("sweep %d listed ResourceClaims %d times, want %d", i, got, want.lists)
		}
		if got := claimCalls("get") - gets; got < want.gets {
			t.Errorf("sweep %d got ResourceClaims %d times, want at least %d", i, got, want.gets)
		}
	}
	if cp := h.checkpoint(); !strings.Contains(cp, `"namespace":"default","name":"trainer-gpus"`) {
		t.Errorf("the adopted claim was not named: %s", cp)
	}
	other := h.claim("gpu-1")
	if r := h.prepare(other).Claims[string(other.UID)]; r == nil || !strings.Contains(r.Error, "default/trainer-gpus (uid "+nvPrepared+")") {
		t.Errorf("a claim on gpu-1: %+v, want refused naming default/trainer-gpus", r)
	}
}
