package simnic

import (
	"context"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// demoNode returns the NICs of the demo fleet's dgx-h100-0.
func demoNode(t *testing.T) *simfleet.Node {
	t.Helper()
	f, err := simfleet.Load("demo")
	if err != nil {
		t.Fatal(err)
	}
	n, err := f.Node("dgx-h100-0")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDevices: each NIC is published with the standard PCIe attributes of
// the fleet file and the driver's own.
func TestDevices(t *testing.T) {
	node := demoNode(t)
	devices, err := Devices(node.NICs)
	if err != nil {
		t.Fatal(err)
	}
	if len(devices) != 8 {
		t.Fatalf("%d devices, want 8", len(devices))
	}
	text := func(d resourceapi.Device, name string) string {
		s, _ := devicemodel.AttributeText(d.Attributes[resourceapi.QualifiedName(name)])
		return s
	}
	tests := []struct {
		device int
		want   map[string]string
	}{
		{0, map[string]string{"type": "nic", "model": "ConnectX-7", "linkType": "infiniband", "speedGbps": "400", "rdma": "true", "rdmaDevice": "mlx5_0",
			"resource.kubernetes.io/pcieRoot": "pci0000:15", "resource.kubernetes.io/pciBusID": "0000:18:00.0", "resource.kubernetes.io/numaNode": "0"}},
		{7, map[string]string{"rdmaDevice": "mlx5_7", "resource.kubernetes.io/pcieRoot": "pci0000:c7", "resource.kubernetes.io/pciBusID": "0000:dc:00.0", "resource.kubernetes.io/numaNode": "1"}},
	}
	for _, tt := range tests {
		d := devices[tt.device]
		if d.Name != DeviceName(tt.device) {
			t.Errorf("device %d named %s", tt.device, d.Name)
		}
		for name, want := range tt.want {
			if got := text(d, name); got != want {
				t.Errorf("%s: %s = %q, want %q", d.Name, name, got, want)
			}
		}
	}

	// No NUMA affinity, no bus ID: neither attribute is published.
	minus := -1
	bare, err := Devices([]sim.NIC{{Model: "ConnectX-6", PCIeRoot: "pci0000:00", LinkType: "ethernet", SpeedGbps: 200, NUMANode: &minus}})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []resourceapi.QualifiedName{"resource.kubernetes.io/numaNode", "resource.kubernetes.io/pciBusID"} {
		if _, ok := bare[0].Attributes[name]; ok {
			t.Errorf("%s published for a NIC without it", name)
		}
	}
}

// TestPrepare: a claim's NICs of this node get a CDI spec that the CDI
// library resolves into their RDMA device nodes and NCCL_IB_HCA; claims
// with devices that are not this node's NICs are refused.
func TestPrepare(t *testing.T) {
	node := demoNode(t)
	dir := t.TempDir()
	writer, err := cdi.NewWriter(dir, DefaultDriverName)
	if err != nil {
		t.Fatal(err)
	}
	d := &Driver{cfg: Config{DriverName: DefaultDriverName, NodeName: node.Name, NICs: node.NICs}, index: map[string]int{}, cdi: writer}
	d.devices, _ = Devices(node.NICs)
	for i, dev := range d.devices {
		d.index[dev.Name] = i
	}
	claim := func(uid string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c-" + uid, UID: types.UID("uid-" + uid)}}
		if results != nil {
			c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
		}
		return c
	}
	nic := func(request, device string) resourceapi.DeviceRequestAllocationResult {
		return resourceapi.DeviceRequestAllocationResult{Request: request, Driver: DefaultDriverName, Pool: node.Name, Device: device}
	}
	gpu := resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: "gpu.nvidia.com", Pool: node.Name, Device: "gpu-3"}

	tests := []struct {
		name      string
		claim     *resourceapi.ResourceClaim
		wantErr   string
		wantNodes []string
		wantHCA   string
	}{
		{"GPU and NIC", claim("a", gpu, nic("nic", "nic-3")), "",
			[]string{"/dev/infiniband/rdma_cm", "/dev/infiniband/umad3", "/dev/infiniband/uverbs3"}, "=mlx5_3"},
		{"two NICs", claim("b", nic("nics", "nic-0"), nic("nics", "nic-1")), "",
			[]string{"/dev/infiniband/rdma_cm", "/dev/infiniband/umad0", "/dev/infiniband/umad1", "/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1"}, "=mlx5_0,mlx5_1"},
		{"not allocated", claim("c"), "is not allocated", nil, ""},
		{"unknown device", claim("d", nic("nic", "nic-8")), "device nic-8 of pool dgx-h100-0 is not a NIC of node dgx-h100-0", nil, ""},
		{"other node's pool", claim("e", resourceapi.DeviceRequestAllocationResult{Request: "nic", Driver: DefaultDriverName, Pool: "dgx-h100-1", Device: "nic-0"}),
			"is not a NIC of node dgx-h100-0", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			devices, err := d.prepare(tt.claim)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				if writer.Exists(string(tt.claim.UID)) {
					t.Error("a refused claim got a CDI spec")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, dev := range devices {
				if dev.PoolName != node.Name || len(dev.CDIDeviceIDs) != 1 {
					t.Errorf("device %+v", dev)
				}
				ids = append(ids, dev.CDIDeviceIDs...)
			}
			cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
			if err != nil {
				t.Fatal(err)
			}
			spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
			if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
				t.Fatalf("CDI devices %v unresolved: %v", unresolved, err)
			}
			var nodes []string
			for _, n := range spec.Linux.Devices {
				nodes = append(nodes, n.Path)
			}
			slices.Sort(nodes)
			if !slices.Equal(nodes, tt.wantNodes) {
				t.Errorf("device nodes %v, want %v", nodes, tt.wantNodes)
			}
			if !slices.Contains(spec.Process.Env, NCCLIBHCAEnv+"="+tt.wantHCA) {
				t.Errorf("environment %v, want %s=%s", spec.Process.Env, NCCLIBHCAEnv, tt.wantHCA)
			}

			// Unprepare removes the spec, and again is no error.
			for range 2 {
				errs, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: tt.claim.UID}})
				if err != nil || errs[tt.claim.UID] != nil {
					t.Fatalf("unprepare: %v, %v", err, errs)
				}
			}
			if writer.Exists(string(tt.claim.UID)) {
				t.Error("spec still there after unprepare")
			}
		})
	}
}
