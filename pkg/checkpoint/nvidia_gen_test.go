package checkpoint

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// The committed NVIDIA DRA driver checkpoints in testdata/nvidia are written
// by TestNVIDIAFixtures the way NVIDIA's driver writes them (its
// cmd/gpu-kubelet-plugin on main after v25.12.0, read for this;
// docs/design/checkpoint.md names the commits): the Go types below have the JSON
// layout of NVIDIA's checkpoint types (same field names, order and
// omitempty), the file is json.Marshal's output of the whole checkpoint, and
// both checksums are the kubelet checkpointmanager's (KubeletChecksum) over
// the same serializations NVIDIA hashes. The claim status is the real
// resource.k8s.io/v1 ResourceClaimStatus, as in NVIDIA's types.
//
// Regenerate with: go test ./pkg/checkpoint -run TestNVIDIAFixtures -update-nvidia
// Without the flag the test checks that the committed files are exactly what
// the generator writes. localcluster/test/nvidiacompat checks the committed
// checksums against k8s.io/kubernetes' own checksum package.
var updateNVIDIA = flag.Bool("update-nvidia", false, "rewrite testdata/nvidia/*.json")

// nvTestBootID is the boot recorded in the generated v2 files.
const nvTestBootID = "7d3c1b0e-5a4f-4c2e-9b8a-1f2e3d4c5b6a"

type genCheckpoint struct {
	Version  string `json:"version,omitempty"`
	Checksum uint64 `json:"checksum"`
	V1       *genV1 `json:"v1,omitempty"`
	V2       *genV2 `json:"v2,omitempty"`
}

type genV2 struct {
	Checksum       uint64                `json:"checksum"`
	PreparedClaims map[string]genClaimV2 `json:"preparedClaims,omitempty"`
	NodeBootID     string                `json:"nodeBootID,omitempty"`
}

type genClaimV2 struct {
	CheckpointState string                          `json:"checkpointState"`
	Status          resourceapi.ResourceClaimStatus `json:"status,omitempty"`
	PreparedDevices []*genGroup                     `json:"preparedDevices,omitempty"`
	Name            string                          `json:"name,omitempty"`
	Namespace       string                          `json:"namespace,omitempty"`
}

type genV1 struct {
	PreparedClaims map[string]genClaimV1 `json:"preparedClaims,omitempty"`
}

type genClaimV1 struct {
	Status          resourceapi.ResourceClaimStatus `json:"status,omitempty"`
	PreparedDevices []*genGroup                     `json:"preparedDevices,omitempty"`
}

type genGroup struct {
	Devices     []genDevice `json:"devices"`
	ConfigState struct {
		MpsControlDaemonID string `json:"mpsControlDaemonID"`
	} `json:"configState"`
}

type genDevice struct {
	Gpu  *genGPU  `json:"gpu"`
	Mig  *genMIG  `json:"mig"`
	Vfio *genVFIO `json:"vfio,omitempty"`
}

type genGPU struct {
	Info   *genInfo       `json:"info"`
	Device *genKubeletDev `json:"device"`
}

type genInfo struct {
	UUID string `json:"uuid"`
}

type genMIG struct {
	Concrete *genLiveTuple  `json:"concrete"`
	Device   *genKubeletDev `json:"device"`
}

type genLiveTuple struct {
	ParentMinor    int    `json:"parentMinor"`
	GIID           int    `json:"giId"`
	CIID           int    `json:"ciId"`
	MigUUID        string `json:"migUUID"`
	ParentUUID     string `json:"parentUUID"`
	ParentPCIBusID string `json:"parentPCIBusID,omitempty"`
}

type genVFIO struct {
	Info   *genInfo       `json:"info"`
	Device *genKubeletDev `json:"device"`
}

type genKubeletDev struct {
	Requests     []string `json:"Requests"`
	PoolName     string   `json:"PoolName"`
	DeviceName   string   `json:"DeviceName"`
	CDIDeviceIDs []string `json:"CDIDeviceIDs"`
	ShareID      *string  `json:"ShareID,omitempty"`
}

// nvLayout is the layout of one of NVIDIA's releases.
type nvLayout int

const (
	// nvCurrent is NVIDIA's main since its Checkpoint got a Version
	// field: "version":"v2", then the v1 and v2 sections.
	nvCurrent nvLayout = iota
	// nvUnversioned is its releases with the v2 section and no version
	// field (v25.12.0 among them): the same bytes without "version".
	nvUnversioned
	// nvLegacy is its releases before the v2 section: only v1.
	nvLegacy
)

// marshalNVIDIA writes cp as an NVIDIA release of the layout does: a v1
// section holding the completed claims, the v1 checksum over the v1 view,
// the v2 checksum over the v2 section. A legacy release has no v2 and its
// checksum is over the whole checkpoint with checksum 0 (the same bytes as
// the v1 view).
func marshalNVIDIA(t *testing.T, v2 *genV2, layout nvLayout) []byte {
	t.Helper()
	v1 := &genV1{PreparedClaims: map[string]genClaimV1{}}
	for uid, c := range v2.PreparedClaims {
		if c.CheckpointState == phaseCompleted {
			v1.PreparedClaims[uid] = genClaimV1{Status: c.Status, PreparedDevices: c.PreparedDevices}
		}
	}
	cp := &genCheckpoint{V1: v1}
	switch layout {
	case nvCurrent:
		cp.Version, cp.V2 = "v2", v2
	case nvUnversioned:
		cp.V2 = v2
	}
	view, err := json.Marshal(struct {
		Checksum uint64 `json:"checksum"`
		V1       *genV1 `json:"v1,omitempty"`
	}{V1: cp.V1})
	if err != nil {
		t.Fatal(err)
	}
	cp.Checksum = KubeletChecksum(view)
	if cp.V2 != nil {
		cp.V2.Checksum = 0
		raw, err := json.Marshal(*cp.V2)
		if err != nil {
			t.Fatal(err)
		}
		cp.V2.Checksum = KubeletChecksum(raw)
	}
	data, err := json.Marshal(cp)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func allocated(node string, results ...resourceapi.DeviceRequestAllocationResult) resourceapi.ResourceClaimStatus {
	for i := range results {
		results[i].Driver, results[i].Pool = "gpu.nvidia.com", node
	}
	return resourceapi.ResourceClaimStatus{
		Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}},
		ReservedFor: []resourceapi.ResourceClaimConsumerReference{
			{Resource: "pods", Name: "trainer-0", UID: "0a1b2c3d-4e5f-4a6b-8c7d-000000000001"},
		},
	}
}

func kdev(node, uid, request, device string) *genKubeletDev {
	return &genKubeletDev{Requests: []string{request}, PoolName: node, DeviceName: device,
		CDIDeviceIDs: []string{"k8s.gpu.nvidia.com/claim=" + uid + "-" + device}}
}

// UIDs and UUIDs of the generated files.
const (
	nvNode          = "node-1"
	nvClaimGPUs     = "a1b2c3d4-0000-4000-8000-000000000001"
	nvClaimStarted  = "a1b2c3d4-0000-4000-8000-000000000002"
	nvClaimEmpty    = "a1b2c3d4-0000-4000-8000-000000000003"
	nvClaimMIG      = "a1b2c3d4-0000-4000-8000-000000000004"
	nvGPU0UUID      = "GPU-00000000-1111-2222-3333-000000000000"
	nvGPU1UUID      = "GPU-00000000-1111-2222-3333-000000000001"
	nvGPU2UUID      = "GPU-00000000-1111-2222-3333-000000000002"
	nvMIGUUID       = "MIG-44444444-5555-6666-7777-888888888888"
	nvMIGDeviceName = "gpu-2-mig-1g12gb-19-0"
)

// UIDs and share IDs of v2-shares.json.
const (
	nvClaimShareA       = "a1b2c3d4-0000-4000-8000-000000000005"
	nvClaimShareB       = "a1b2c3d4-0000-4000-8000-000000000006"
	nvClaimShareStarted = "a1b2c3d4-0000-4000-8000-000000000007"
	nvShareA            = "5a0e3c1f-8b2d-4e6a-9f70-000000000001"
	nvShareB            = "5a0e3c1f-8b2d-4e6a-9f70-000000000002"
	nvShareStarted      = "5a0e3c1f-8b2d-4e6a-9f70-000000000003"
)

// nvidiaShares is a node of NVIDIA's driver with its ConsumableShares gate
// on (GPUs published with allowMultipleAllocations and a memory capacity):
// two claims prepared, each with a share of gpu-0, and one started with a
// share of gpu-1. The share ID is in the allocation result only: NVIDIA
// builds the prepared kubeletplugin.Device from request, pool, device and
// CDI IDs, so its ShareID is unset (and, omitempty, absent).
func nvidiaShares(node, bootID string) *genV2 {
	share := func(request, device, id, memory string) resourceapi.DeviceRequestAllocationResult {
		return resourceapi.DeviceRequestAllocationResult{Request: request, Device: device, ShareID: ptr.To(types.UID(id)),
			ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(memory)}}
	}
	prepared := func(uid, request string, result resourceapi.DeviceRequestAllocationResult) genClaimV2 {
		return genClaimV2{
			CheckpointState: phaseCompleted,
			Status:          allocated(node, result),
			PreparedDevices: []*genGroup{{Devices: []genDevice{
				{Gpu: &genGPU{Info: &genInfo{UUID: nvGPU0UUID}, Device: kdev(node, uid, request, result.Device)}},
			}}},
		}
	}
	return &genV2{NodeBootID: bootID, PreparedClaims: map[string]genClaimV2{
		nvClaimShareA: prepared(nvClaimShareA, "gpu", share("gpu", "gpu-0", nvShareA, "20Gi")),
		nvClaimShareB: prepared(nvClaimShareB, "inference", share("inference", "gpu-0", nvShareB, "40Gi")),
		nvClaimShareStarted: {
			CheckpointState: "PrepareStarted",
			Status:          allocated(node, share("gpu", "gpu-1", nvShareStarted, "10Gi")),
			Name:            "half-shared",
			Namespace:       "ml-team",
		},
	}}
}

// nvidiaFixtures are the files in testdata/nvidia.
func nvidiaFixtures(t *testing.T) map[string][]byte {
	gpus := &genV2{NodeBootID: nvTestBootID, PreparedClaims: map[string]genClaimV2{
		// Two full GPUs, prepared: NVIDIA drops name and namespace when
		// it records the completion.
		nvClaimGPUs: {
			CheckpointState: phaseCompleted,
			Status: allocated(nvNode,
				resourceapi.DeviceRequestAllocationResult{Request: "gpus", Device: "gpu-0"},
				resourceapi.DeviceRequestAllocationResult{Request: "gpus", Device: "gpu-1"}),
			PreparedDevices: []*genGroup{{Devices: []genDevice{
				{Gpu: &genGPU{Info: &genInfo{UUID: nvGPU0UUID}, Device: kdev(nvNode, nvClaimGPUs, "gpus", "gpu-0")}},
				{Gpu: &genGPU{Info: &genInfo{UUID: nvGPU1UUID}, Device: kdev(nvNode, nvClaimGPUs, "gpus", "gpu-1")}},
			}}},
		},
		// Started, not completed: the plugin died while preparing it.
		nvClaimStarted: {
			CheckpointState: "PrepareStarted",
			Status:          allocated(nvNode, resourceapi.DeviceRequestAllocationResult{Request: "gpu", Device: "gpu-2", AdminAccess: ptr.To(false)}),
			Name:            "half-done",
			Namespace:       "ml-team",
		},
		// Started before the allocation was checked: holds nothing.
		nvClaimEmpty: {CheckpointState: "PrepareStarted", Name: "unallocated", Namespace: "ml-team"},
	}}
	mig := &genV2{PreparedClaims: map[string]genClaimV2{
		nvClaimMIG: {
			CheckpointState: phaseCompleted,
			Status:          allocated(nvNode, resourceapi.DeviceRequestAllocationResult{Request: "mig", Device: nvMIGDeviceName}),
			PreparedDevices: []*genGroup{{Devices: []genDevice{
				{Mig: &genMIG{Concrete: &genLiveTuple{ParentMinor: 2, GIID: 9, CIID: 0, MigUUID: nvMIGUUID, ParentUUID: nvGPU2UUID},
					Device: kdev(nvNode, nvClaimMIG, "mig", nvMIGDeviceName)}},
			}}},
		},
	}}
	// For pkg/draplugin's test: node dgx-h100-0 of the simulated dgx-h100
	// fleet (its GPUs' UUIDs), in the plugin harness's boot.
	const h100 = "dgx-h100-0"
	plugin := &genV2{NodeBootID: "boot-1", PreparedClaims: map[string]genClaimV2{
		nvClaimGPUs: {
			CheckpointState: phaseCompleted,
			Status: allocated(h100,
				resourceapi.DeviceRequestAllocationResult{Request: "gpus", Device: "gpu-0"},
				resourceapi.DeviceRequestAllocationResult{Request: "gpus", Device: "gpu-1"}),
			PreparedDevices: []*genGroup{{Devices: []genDevice{
				{Gpu: &genGPU{Info: &genInfo{UUID: "GPU-9f254704-323e-54e8-af53-3241ba4bef7d"}, Device: kdev(h100, nvClaimGPUs, "gpus", "gpu-0")}},
				{Gpu: &genGPU{Info: &genInfo{UUID: "GPU-c74d5aca-296e-5109-96ef-3f49b7da58bd"}, Device: kdev(h100, nvClaimGPUs, "gpus", "gpu-1")}},
			}}},
		},
		nvClaimStarted: {
			CheckpointState: "PrepareStarted",
			Status:          allocated(h100, resourceapi.DeviceRequestAllocationResult{Request: "gpu", Device: "gpu-2"}),
			Name:            "half-done",
			Namespace:       "default",
		},
	}}
	legacy := &genV2{PreparedClaims: map[string]genClaimV2{nvClaimGPUs: gpus.PreparedClaims[nvClaimGPUs]}}

	out := map[string][]byte{
		"v2-gpus.json":       marshalNVIDIA(t, gpus, nvCurrent),
		"v2-mig.json":        marshalNVIDIA(t, mig, nvCurrent),
		"v1-legacy.json":     marshalNVIDIA(t, legacy, nvLegacy),
		"v2-dgx-h100-0.json": marshalNVIDIA(t, plugin, nvCurrent),
		"v2-shares.json":     marshalNVIDIA(t, nvidiaShares(nvNode, nvTestBootID), nvUnversioned),
	}
	// The same as v2-gpus.json with one device renamed after the
	// checksums were computed: what NVIDIA's driver refuses as corrupt.
	out["v2-bad-checksum.json"] = bytes.Replace(out["v2-gpus.json"], []byte(`"DeviceName":"gpu-1"`), []byte(`"DeviceName":"gpu-3"`), 2)
	if bytes.Equal(out["v2-bad-checksum.json"], out["v2-gpus.json"]) {
		t.Fatal("damaging v2-gpus.json changed nothing")
	}
	return out
}

// TestNVIDIAFixtures keeps testdata/nvidia what the generator writes.
func TestNVIDIAFixtures(t *testing.T) {
	for name, want := range nvidiaFixtures(t) {
		path := filepath.Join("testdata", "nvidia", name)
		if *updateNVIDIA {
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (regenerate with -update-nvidia)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what the generator writes (regenerate with -update-nvidia)", path)
		}
	}
}
