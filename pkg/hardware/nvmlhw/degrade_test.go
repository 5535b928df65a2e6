package nvmlhw_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/nvmlhw"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// simNode is three H100s; the first one, with mig, is in MIG mode with
// one 1g.10gb MIG device.
func simNode(t *testing.T, mig bool) *sim.Node {
	t.Helper()
	first := "- model: H100-SXM5-80GB\n"
	if mig {
		first += "    migEnabled: true\n    migDevices: [{profile: 1g.10gb}]\n"
	}
	fleet, err := simfleet.Parse([]byte("nodes:\n- name: node-0\n  gpus:\n  "+first+"  - model: H100-SXM5-80GB\n  - model: H100-SXM5-80GB\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	n, err := fleet.Node("node-0")
	if err != nil {
		t.Fatal(err)
	}
	return &n.Node
}

// unreadWant is an unread property a test expects: its query starts with
// the NVML function's name, and its error is NVML's.
type unreadWant struct {
	property hardware.Property
	query    string
}

// One NVML query the GPU does not answer leaves that property (and what
// derives from it) empty and published, with a record naming the query;
// the GPU and the node's other GPUs stay. Only what identifies the GPU,
// or a GPU lost, leaves it out. The fake NVML answers every query of the node's first
// GPU first, so failing the first call fails the first GPU's.
func TestDiscoverDegradesGPU(t *testing.T) {
	tests := []struct {
		name string
		call string
		ret  nvml.Return
		mig  bool
		// clear empties what the GPU lacks; nil: the GPU is left out,
		// with a problem naming the call.
		clear  func(g *hardware.GPU)
		unread []unreadWant
	}{
		{name: "brand", call: "nvmlDeviceGetBrand", ret: nvml.ERROR_NOT_SUPPORTED,
			clear:  func(g *hardware.GPU) { g.Brand = "" },
			unread: []unreadWant{{hardware.PropertyBrand, "nvmlDeviceGetBrand"}}},
		{name: "architecture", call: "nvmlDeviceGetArchitecture", ret: nvml.ERROR_UNKNOWN,
			clear:  func(g *hardware.GPU) { g.Architecture = "" },
			unread: []unreadWant{{hardware.PropertyArchitecture, "nvmlDeviceGetArchitecture"}}},
		{name: "compute capability", call: "nvmlDeviceGetCudaComputeCapability", ret: nvml.ERROR_FUNCTION_NOT_FOUND,
			clear:  func(g *hardware.GPU) { g.CUDAComputeCapability = "" },
			unread: []unreadWant{{hardware.PropertyCUDAComputeCapability, "nvmlDeviceGetCudaComputeCapability"}}},
		// GB10's unified memory: the MIG profile names derive from the
		// memory, so they go too.
		{name: "memory", call: "nvmlDeviceGetMemoryInfo", ret: nvml.ERROR_NOT_SUPPORTED,
			clear: func(g *hardware.GPU) {
				g.MemoryBytes, g.MIGProfiles, g.MIGMemorySlices = 0, nil, 0
			},
			unread: []unreadWant{{hardware.PropertyMemory, "nvmlDeviceGetMemoryInfo"}}},
		// Without a bus ID the topology is not asked for.
		{name: "PCI bus ID", call: "nvmlDeviceGetPciInfo", ret: nvml.ERROR_NOT_SUPPORTED,
			clear:  func(g *hardware.GPU) { g.PCIBusID, g.PCIeRoot, g.NUMANode = "", "", nil },
			unread: []unreadWant{{hardware.PropertyPCIBusID, "nvmlDeviceGetPciInfo"}}},
		{name: "MIG mode", call: "nvmlDeviceGetMigMode", ret: nvml.ERROR_UNKNOWN,
			clear: func(g *hardware.GPU) {
				g.MIGCapable, g.MIGProfiles, g.MIGMemorySlices = false, nil, 0
			},
			unread: []unreadWant{{hardware.PropertyMIGMode, "nvmlDeviceGetMigMode"}}},
		{name: "MIG profiles", call: "nvmlDeviceGetGpuInstanceProfileInfo", ret: nvml.ERROR_UNKNOWN,
			clear:  func(g *hardware.GPU) { g.MIGProfiles, g.MIGMemorySlices = nil, 0 },
			unread: []unreadWant{{hardware.PropertyMIGProfiles, "nvmlDeviceGetGpuInstanceProfileInfo(0)"}}},
		{name: "MIG placements", call: "nvmlDeviceGetGpuInstancePossiblePlacements", ret: nvml.ERROR_UNKNOWN,
			clear:  func(g *hardware.GPU) { g.MIGProfiles, g.MIGMemorySlices = nil, 0 },
			unread: []unreadWant{{hardware.PropertyMIGProfiles, "nvmlDeviceGetGpuInstancePossiblePlacements(profile "}}},
		// MIG devices are told apart by their profiles.
		{name: "MIG profiles in MIG mode", call: "nvmlDeviceGetGpuInstanceProfileInfo", ret: nvml.ERROR_UNKNOWN, mig: true,
			clear: func(g *hardware.GPU) { g.MIGProfiles, g.MIGMemorySlices, g.MIGDevices = nil, 0, nil },
			unread: []unreadWant{
				{hardware.PropertyMIGProfiles, "nvmlDeviceGetGpuInstanceProfileInfo(0)"},
				{hardware.PropertyMIGDevices, "nvmlDeviceGetGpuInstanceProfileInfo(0)"},
			}},
		// Where the MIG devices lie is unknown, so no placement either.
		{name: "MIG device count", call: "nvmlDeviceGetMaxMigDeviceCount", ret: nvml.ERROR_TIMEOUT, mig: true,
			clear:  func(g *hardware.GPU) { g.MIGProfiles, g.MIGMemorySlices, g.MIGDevices = nil, 0, nil },
			unread: []unreadWant{{hardware.PropertyMIGDevices, "nvmlDeviceGetMaxMigDeviceCount"}}},
		{name: "MIG device handle", call: "nvmlDeviceGetMigDeviceHandleByIndex", ret: nvml.ERROR_UNKNOWN, mig: true,
			clear:  func(g *hardware.GPU) { g.MIGProfiles, g.MIGMemorySlices, g.MIGDevices = nil, 0, nil },
			unread: []unreadWant{{hardware.PropertyMIGDevices, "nvmlDeviceGetMigDeviceHandleByIndex(0)"}}},

		{name: "handle", call: "nvmlDeviceGetHandleByIndex", ret: nvml.ERROR_GPU_IS_LOST},
		// A GPU that fell off the bus answers nothing more; a running
		// plugin keeps what it published of it, tainted.
		{name: "lost at memory", call: "nvmlDeviceGetMemoryInfo", ret: nvml.ERROR_GPU_IS_LOST},
		{name: "lost at MIG devices", call: "nvmlDeviceGetMaxMigDeviceCount", ret: nvml.ERROR_GPU_IS_LOST, mig: true},
		{name: "UUID", call: "nvmlDeviceGetUUID", ret: nvml.ERROR_UNKNOWN},
		{name: "name", call: "nvmlDeviceGetName", ret: nvml.ERROR_GPU_IS_LOST},
		{name: "minor", call: "nvmlDeviceGetMinorNumber", ret: nvml.ERROR_NOT_SUPPORTED},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			node := simNode(t, tt.mig)
			clean, err := node.Hardware().Discover(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(clean.GPUs) != 3 || clean.Problems != nil || clean.GPUs[0].Unread != nil {
				t.Fatalf("clean discovery: GPUs %v, problems %+v, unread %+v", gpuUUIDs(clean), clean.Problems, clean.GPUs[0].Unread)
			}
			faults := &sim.Faults{}
			faults.Fail(tt.call, 1, tt.ret)
			inv, err := node.Hardware(sim.WithFaults(faults)).Discover(context.Background())
			if err != nil {
				t.Fatalf("one unanswered %s failed discovery: %v", tt.call, err)
			}
			first := clean.GPUs[0]

			if tt.clear == nil {
				if got, want := gpuUUIDs(inv), gpuUUIDs(clean)[1:]; !reflect.DeepEqual(got, want) {
					t.Errorf("discovered %v, want %v: the GPU without its identity left out", got, want)
				}
				uuid := first.UUID
				if tt.call == "nvmlDeviceGetHandleByIndex" || tt.call == "nvmlDeviceGetUUID" {
					uuid = ""
				}
				want := fmt.Sprintf("GPU 0 (%s): %s: %v", uuid, tt.call, tt.ret)
				if uuid == "" {
					want = fmt.Sprintf("GPU 0: %s: %v", tt.call, tt.ret)
				}
				if len(inv.Problems) != 1 || inv.Problems[0].Index != 0 || inv.Problems[0].UUID != uuid || inv.Problems[0].Err != want {
					t.Errorf("problems %+v, want one of GPU 0 (UUID %q) saying %q", inv.Problems, uuid, want)
				}
				return
			}

			if inv.Problems != nil {
				t.Errorf("problems %+v, want none: the GPU is published", inv.Problems)
			}
			if !reflect.DeepEqual(inv.GPUs[1:], clean.GPUs[1:]) {
				t.Errorf("the other GPUs changed:\n got %+v\nwant %+v", inv.GPUs[1:], clean.GPUs[1:])
			}
			if len(inv.GPUs) != 3 {
				t.Fatalf("discovered %v, want all three GPUs", gpuUUIDs(inv))
			}
			got := inv.GPUs[0]
			if len(got.Unread) != len(tt.unread) {
				t.Fatalf("unread %+v, want %d", got.Unread, len(tt.unread))
			}
			for i, w := range tt.unread {
				u := got.Unread[i]
				if u.Property != w.property || !strings.HasPrefix(u.Query, w.query) || u.Err != tt.ret.Error() {
					t.Errorf("unread[%d] %+v, want %s from %s...: %v", i, u, w.property, w.query, tt.ret)
				}
			}
			want := first
			tt.clear(&want)
			want.Unread = got.Unread
			if !reflect.DeepEqual(got, want) {
				t.Errorf("GPU 0:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

// The topology NVML does not answer comes from sysfs; a GPU whose entry
// there cannot be read is published without PCIe root and NUMA node, and
// the records name the files.
func TestDiscoverDegradesTopology(t *testing.T) {
	root := t.TempDir()
	sysfsWithGPU(t, root, "0000:1b:00.0", "pci0000:15", "1")
	sysfsWithGPU(t, root, "0000:1d:00.0", "pci0000:15", "0")
	// GPU 1's entry does not point into devices/pci*, and its numa_node
	// holds no number.
	write(t, filepath.Join(root, "elsewhere", "0000:1c:00.0", "numa_node"), "zero\n")
	if err := os.Symlink("../../../elsewhere/0000:1c:00.0", filepath.Join(root, "bus", "pci", "devices", "0000:1c:00.0")); err != nil {
		t.Fatal(err)
	}
	m := newMockLib(newMockGPU(0), newMockGPU(1), newMockGPU(2))
	inv, err := nvmlhw.NewFromInterface(m.lib, nvmlhw.NewSysfsTopology(root), staticSystem{}).Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) != 3 || inv.Problems != nil {
		t.Fatalf("GPUs %v, problems %+v; want all three, no problem", gpuUUIDs(inv), inv.Problems)
	}
	if g := inv.GPUs[0]; g.PCIeRoot != "pci0000:15" || g.NUMANode == nil || *g.NUMANode != 1 || g.Unread != nil {
		t.Errorf("GPU 0: %+v, want its topology", g)
	}
	g := inv.GPUs[1]
	if g.PCIBusID != "0000:1c:00.0" || g.PCIeRoot != "" || g.NUMANode != nil {
		t.Errorf("GPU 1: bus %q, root %q, NUMA %v; want its bus ID and no topology", g.PCIBusID, g.PCIeRoot, g.NUMANode)
	}
	entry := filepath.Join(root, "bus", "pci", "devices", "0000:1c:00.0")
	if len(g.Unread) != 2 ||
		g.Unread[0].Property != hardware.PropertyPCIeRoot || g.Unread[0].Query != entry || g.Unread[0].Err == "" ||
		g.Unread[1].Property != hardware.PropertyNUMANode || g.Unread[1].Query != filepath.Join(entry, "numa_node") ||
		!strings.HasPrefix(g.Unread[1].Err, "not a NUMA node: ") {
		t.Errorf("GPU 1 unread %+v, want the PCIe root from %s and the NUMA node from its numa_node", g.Unread, entry)
	}
}

// Brands and architectures go-nvlib cannot name yet (newer than it) are
// published as NVML's numbers, not dropped: NVML did answer.
func TestDiscoverNamesNewEnums(t *testing.T) {
	d := newMockGPU(0)
	d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return 42, nvml.SUCCESS }
	d.GetBrandFunc = func() (nvml.BrandType, nvml.Return) { return 77, nvml.SUCCESS }
	inv, err := newMockLib(d).discover(staticSystem{})
	if err != nil {
		t.Fatal(err)
	}
	if g := inv.GPUs[0]; g.Architecture != "42" || g.Brand != "77" || g.Unread != nil {
		t.Errorf("architecture %q, brand %q, unread %+v; want NVML's numbers 42 and 77, nothing unread", g.Architecture, g.Brand, g.Unread)
	}
}
