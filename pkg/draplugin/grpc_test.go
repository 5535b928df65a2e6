package draplugin_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

// ociEdits resolves CDI device IDs with the CDI library, as a container
// runtime does, into a fresh OCI spec.
func ociEdits(t *testing.T, cdiDir string, ids []string) *ocispec.Spec {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	spec := &ocispec.Spec{Process: &ocispec.Process{}, Linux: &ocispec.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		t.Fatalf("inject CDI devices %v: unresolved %v: %v (spec errors %v)", ids, unresolved, err, cache.GetErrors())
	}
	return spec
}

type node struct {
	path         string
	major, minor int64
}

func deviceNodes(spec *ocispec.Spec) []node {
	var out []node
	for _, d := range spec.Linux.Devices {
		if d.Type != "c" {
			continue
		}
		out = append(out, node{d.Path, d.Major, d.Minor})
	}
	slices.SortFunc(out, func(a, b node) int { return strings.Compare(a.path, b.path) })
	return out
}

func TestPrepareUnprepareOverGRPC(t *testing.T) {
	h := newHarness(t)
	claim := h.claim("gpu-0", "gpu-3")

	resp := h.mustPrepare(claim)
	if len(resp.Devices) != 2 {
		t.Fatalf("got %d devices, want 2: %v", len(resp.Devices), resp.Devices)
	}
	var ids []string
	for i, d := range resp.Devices {
		want := []string{"gpu-0", "gpu-3"}[i]
		if d.PoolName != nodeName || d.DeviceName != want {
			t.Errorf("device %d: got %s/%s, want %s/%s", i, d.PoolName, d.DeviceName, nodeName, want)
		}
		if len(d.CdiDeviceIds) != 1 || !strings.Contains(d.CdiDeviceIds[0], string(claim.UID)) {
			t.Errorf("device %d: CDI IDs %v should name the claim UID %s", i, d.CdiDeviceIds, claim.UID)
		}
		if !strings.HasPrefix(d.CdiDeviceIds[0], "k8s.gpu.nvidia.com/claim=") {
			t.Errorf("device %d: CDI ID %s has the wrong kind", i, d.CdiDeviceIds[0])
		}
		ids = append(ids, d.CdiDeviceIds...)
	}

	spec := ociEdits(t, h.cfg.CDIDir, ids)
	// Majors of the simulated node: nvidia 195, nvidia-uvm from its /proc/devices.
	uvm := deviceNodes(spec)[0].major
	want := []node{
		{"/dev/nvidia-uvm", uvm, 0},
		{"/dev/nvidia-uvm-tools", uvm, 1},
		{"/dev/nvidia0", 195, 0},
		{"/dev/nvidia3", 195, 3},
		{"/dev/nvidiactl", 195, 255},
	}
	slices.SortFunc(want, func(a, b node) int { return strings.Compare(a.path, b.path) })
	if got := deviceNodes(spec); !slices.Equal(got, want) {
		t.Errorf("device nodes:\n got %v\nwant %v", got, want)
	}
	if uvm == 0 || uvm == 195 {
		t.Errorf("nvidia-uvm major %d is not a plausible dynamic major", uvm)
	}
	if !slices.Contains(spec.Process.Env, "NVIDIA_VISIBLE_DEVICES=void") {
		t.Errorf("env %v lacks NVIDIA_VISIBLE_DEVICES=void", spec.Process.Env)
	}

	// Prepare is idempotent: the same answer, no new write.
	before := h.checkpoint()
	again := h.mustPrepare(claim)
	if !slices.Equal(again.Devices[0].CdiDeviceIds, resp.Devices[0].CdiDeviceIds) || len(again.Devices) != 2 {
		t.Errorf("second prepare answered %v, first %v", again.Devices, resp.Devices)
	}
	if h.checkpoint() != before {
		t.Error("second prepare rewrote the checkpoint")
	}

	h.mustUnprepare(claim)
	if files := h.specFiles(); len(files) != 0 {
		t.Errorf("CDI specs left after unprepare: %v", files)
	}
	if strings.Contains(h.checkpoint(), string(claim.UID)) {
		t.Errorf("checkpoint still names the claim after unprepare:\n%s", h.checkpoint())
	}
	// Unprepare is idempotent, also for claims never seen.
	h.mustUnprepare(claim)
	h.mustUnprepare(&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "never", UID: "never-seen"}})
}

func TestPrepareMIGDevice(t *testing.T) {
	h := newHarness(t, withFleet(t, "demo", "dgx-a100-0"))
	var mig string
	for _, d := range h.driver.Devices() {
		if strings.HasPrefix(d.Name, "gpu-1-mig-3g20gb-") {
			mig = d.Name
		}
	}
	if mig == "" {
		t.Fatalf("no 3g.20gb MIG device on GPU 1 among %d devices", len(h.driver.Devices()))
	}
	claim := h.claim(mig)
	resp := h.mustPrepare(claim)
	spec := ociEdits(t, h.cfg.CDIDir, resp.Devices[0].CdiDeviceIds)
	got := deviceNodes(spec)
	var paths []string
	for _, n := range got {
		paths = append(paths, n.path)
	}
	// The parent GPU's node, the control nodes and two MIG access nodes.
	if !slices.Contains(paths, "/dev/nvidia1") || !slices.Contains(paths, "/dev/nvidiactl") {
		t.Errorf("MIG device nodes %v lack the parent's nodes", paths)
	}
	caps := 0
	for _, n := range got {
		if strings.HasPrefix(n.path, "/dev/nvidia-caps/nvidia-cap") {
			caps++
			if n.major == 0 || n.major == 195 {
				t.Errorf("%s has major %d, want the nvidia-caps major", n.path, n.major)
			}
		}
	}
	if caps != 2 {
		t.Errorf("got %d MIG capability nodes, want 2 (GPU instance and compute instance): %v", caps, got)
	}
	if slices.Contains(paths, "/dev/nvidia0") {
		t.Errorf("MIG device on GPU 1 got GPU 0's node: %v", paths)
	}
}

func TestPrepareRefusals(t *testing.T) {
	h := newHarness(t)
	holder := h.claim("gpu-1")
	h.mustPrepare(holder)

	otherPool := h.claim("gpu-2")
	otherPool.Status.Allocation.Devices.Results[0].Pool = "some-other-node"
	otherPool = h.update(otherPool)

	sharing := h.claim("gpu-4")
	withConfig(sharing, resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing"}}`)
	sharing = h.update(sharing)

	typo := h.claim("gpu-5")
	withConfig(typo, resourceapi.AllocationConfigSourceClaim, nil, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"stratgy":"MPS"}}`)
	typo = h.update(typo)

	badValue := h.claim("gpu-6")
	withConfig(badValue, resourceapi.AllocationConfigSourceClass, nil, `{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"Spatial"}}`)
	badValue = h.update(badValue)

	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  []string
	}{
		{"device held by another claim", h.claim("gpu-1"), []string{"gpu-1", "already prepared for claim default/" + holder.Name}},
		{"device of another pool", otherPool, []string{"pool \"some-other-node\"", nodeName}},
		{"device this node lacks", h.claim("gpu-9"), []string{"gpu-9 is not a device of node"}},
		{"time-slicing without nvidia-smi", sharing, []string{"sharing.strategy TimeSlicing", "cannot set time slices", "claim config #0"}},
		{"unknown field", typo, []string{"stratgy"}},
		{"unknown strategy", badValue, []string{"sharing.strategy", "Spatial", "MPS", "TimeSlicing"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.prepare(tc.claim).Claims[string(tc.claim.UID)]
			if r == nil || r.Error == "" {
				t.Fatalf("prepare succeeded, want an error mentioning %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.Error, w) {
					t.Errorf("error %q does not mention %q", r.Error, w)
				}
			}
			if slices.ContainsFunc(h.specFiles(), func(f string) bool { return strings.Contains(f, string(tc.claim.UID)) }) {
				t.Errorf("a refused claim left a CDI spec: %v", h.specFiles())
			}
		})
	}

	// Admin access is not exclusive.
	admin := h.claim("gpu-1")
	admin.Status.Allocation.Devices.Results[0].AdminAccess = ptr.To(true)
	h.mustPrepare(h.update(admin))
	// A share of a GPU this node does not publish for sharing (allocated
	// before a --sharing change) is refused: its caps are unknown.
	share := h.claim("gpu-7")
	share.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID("share-a"))
	if r := h.prepare(h.update(share)).Claims[string(share.UID)]; r == nil || !strings.Contains(r.Error, "not published for sharing") {
		t.Errorf("share of an unshared GPU: %v, want a refusal naming --sharing", r)
	}

	// A claim with no device of ours prepares to nothing, without a spec.
	foreign := h.claim()
	foreign.Status.Allocation.Devices.Results = []resourceapi.DeviceRequestAllocationResult{{Request: "nic", Driver: "nic.example.com", Pool: nodeName, Device: "eth0"}}
	if r := h.mustPrepare(h.update(foreign)); len(r.Devices) != 0 {
		t.Errorf("foreign-only claim got devices %v", r.Devices)
	}
	if slices.ContainsFunc(h.specFiles(), func(f string) bool { return strings.Contains(f, string(foreign.UID)) }) {
		t.Errorf("foreign-only claim got a CDI spec")
	}

	// Results of other drivers are not ours to prepare.
	mixed := h.claim("gpu-2")
	mixed.Status.Allocation.Devices.Results = append(mixed.Status.Allocation.Devices.Results,
		resourceapi.DeviceRequestAllocationResult{Request: "nic", Driver: "nic.example.com", Pool: nodeName, Device: "eth0"})
	if r := h.mustPrepare(h.update(mixed)); len(r.Devices) != 1 || r.Devices[0].DeviceName != "gpu-2" {
		t.Errorf("mixed claim: got devices %v, want only gpu-2", r.Devices)
	}
}

func (h *harness) update(claim *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	h.tb.Helper()
	updated, err := h.client.ResourceV1().ResourceClaims(claim.Namespace).Update(context.Background(), claim, metav1.UpdateOptions{})
	if err != nil {
		h.tb.Fatal(err)
	}
	return updated
}

func TestConcurrentClaimsForOneDevice(t *testing.T) {
	h := newHarness(t)
	// Eight claims for the same GPU in one call: exactly one wins.
	var claims []*resourceapi.ResourceClaim
	for range 8 {
		claims = append(claims, h.claim("gpu-5"))
	}
	resp := h.prepare(claims...)
	won := 0
	for _, c := range claims {
		r := resp.Claims[string(c.UID)]
		if r.Error == "" {
			won++
		} else if !strings.Contains(r.Error, "already prepared for claim") {
			t.Errorf("loser %s: unexpected error %q", c.Name, r.Error)
		}
	}
	if won != 1 {
		t.Errorf("%d claims got gpu-5, want exactly 1", won)
	}
	if n := len(h.specFiles()); n != 1 {
		t.Errorf("%d CDI specs left, want 1 (the winner's): %v", n, h.specFiles())
	}
}

func TestRestartKeepsPreparedClaims(t *testing.T) {
	h := newHarness(t)
	claim := h.claim("gpu-2")
	first := h.mustPrepare(claim)
	h.restart()
	again := h.mustPrepare(claim)
	if !slices.Equal(first.Devices[0].CdiDeviceIds, again.Devices[0].CdiDeviceIds) {
		t.Errorf("after restart: %v, before: %v", again.Devices, first.Devices)
	}
	// The device is still held across the restart.
	if r := h.prepare(h.claim("gpu-2")).Claims; len(r) != 1 {
		t.Fatal("no result")
	} else {
		for _, v := range r {
			if !strings.Contains(v.Error, "already prepared") {
				t.Errorf("second claim for gpu-2 after restart: %q", v.Error)
			}
		}
	}
	h.mustUnprepare(claim)
	if files := h.specFiles(); len(files) != 0 {
		t.Errorf("specs left: %v", files)
	}
}

// TestMissingSpecIsWrittenAgain: a prepared claim whose spec disappeared
// gets it back on the kubelet's next prepare.
func TestMissingSpecIsWrittenAgain(t *testing.T) {
	h := newHarness(t)
	claim := h.claim("gpu-2")
	resp := h.mustPrepare(claim)
	for _, f := range h.specFiles() {
		if err := os.Remove(filepath.Join(h.cfg.CDIDir, f)); err != nil {
			t.Fatal(err)
		}
	}
	h.mustPrepare(claim)
	spec := ociEdits(t, h.cfg.CDIDir, resp.Devices[0].CdiDeviceIds)
	if !slices.ContainsFunc(deviceNodes(spec), func(n node) bool { return n.path == "/dev/nvidia2" }) {
		t.Errorf("rewritten spec lacks /dev/nvidia2: %v", deviceNodes(spec))
	}
}
