package sim_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

const mib = 1024 * 1024

// discover loads a fleet and discovers every node.
func discover(t *testing.T, nameOrPath string) map[string]*hardware.Inventory {
	t.Helper()
	f, err := simfleet.Load(nameOrPath)
	if err != nil {
		t.Fatalf("Load(%q): %v", nameOrPath, err)
	}
	out := map[string]*hardware.Inventory{}
	for _, name := range f.NodeNames() {
		n, err := f.Node(name)
		if err != nil {
			t.Fatal(err)
		}
		inv, err := n.Hardware().Discover(context.Background())
		if err != nil {
			t.Fatalf("%s: Discover: %v", name, err)
		}
		out[name] = inv
	}
	return out
}

// modelFacts are the figures every GPU of a model must report, and the
// NUMA nodes of the GPUs of its usual 8-GPU system.
type modelFacts struct {
	product, arch, cc string
	memoryMiB         uint64
	numa              [8]int
}

var (
	// DGX A100 runs its AMD CPUs in NPS4 mode: eight NUMA nodes.
	a100 = modelFacts{"NVIDIA A100-SXM4-40GB", "Ampere", "8.0", 40960, [8]int{3, 3, 1, 1, 7, 7, 5, 5}}
	h100 = modelFacts{"NVIDIA H100 80GB HBM3", "Hopper", "9.0", 81559, [8]int{0, 0, 0, 0, 1, 1, 1, 1}}
	h200 = modelFacts{"NVIDIA H200", "Hopper", "9.0", 143771, [8]int{0, 0, 0, 0, 1, 1, 1, 1}}
)

func TestBuiltinFleets(t *testing.T) {
	busIDRE := regexp.MustCompile(`^0000:[0-9a-f]{2}:00\.0$`)
	uuidRE := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	tests := []struct {
		fleet string
		nodes map[string]modelFacts
		// migs is the number of MIG devices per GPU index, per node; -1 is
		// MIG mode on with no MIG device.
		migs map[string][]int
		// trays are the fleet's GB200 compute trays (checkGB200Tray).
		trays []string
	}{
		{"dgx-a100", map[string]modelFacts{"dgx-a100-0": a100}, nil, nil},
		{"dgx-h100", map[string]modelFacts{"dgx-h100-0": h100}, nil, nil},
		{"dgx-h200", map[string]modelFacts{"dgx-h200-0": h200}, nil, nil},
		{"dgx-a100-mig", map[string]modelFacts{"dgx-a100-0": a100},
			map[string][]int{"dgx-a100-0": {7, 4, 2, 1, 0, 0, 0, 0}}, nil},
		{"demo", map[string]modelFacts{"dgx-h100-0": h100, "dgx-h100-1": h100, "dgx-a100-0": a100, "a100-classic": a100},
			map[string][]int{"dgx-h100-0": {0, 0, 0, 0, 0, 0, 4, 7}, "dgx-h100-1": {0, 0, 0, 0, -1, -1, -1, -1}, "dgx-a100-0": {7, 2, 0, 0, 0, 0, 0, 0}},
			[]string{"gb200-0", "gb200-1", "gb200-2", "gb200-3"}},
	}
	// gb200-nvl72 and gh200-nvl32 are TestFabricFleets', vm-quirks and
	// current-models package simfleet's TestVMQuirksFleet and
	// TestCurrentModelsFleet.
	if got, want := len(tests)+4, len(simfleet.BuiltinNames()); got != want {
		t.Errorf("test covers %d fleets, BuiltinNames has %d: %v", got, want, simfleet.BuiltinNames())
	}
	seenUUIDs := map[string]string{}
	for _, tt := range tests {
		t.Run(tt.fleet, func(t *testing.T) {
			invs := discover(t, tt.fleet)
			if len(invs) != len(tt.nodes)+len(tt.trays) {
				t.Fatalf("nodes: got %d, want %d", len(invs), len(tt.nodes)+len(tt.trays))
			}
			trayUUIDs := map[string]bool{}
			for _, node := range tt.trays {
				if invs[node] == nil {
					t.Fatalf("node %s missing", node)
				}
				checkGB200Tray(t, node, invs[node], trayUUIDs)
			}
			if len(trayUUIDs) != 4*len(tt.trays) {
				t.Errorf("%d distinct GPU UUIDs on %d GB200 trays", len(trayUUIDs), len(tt.trays))
			}
			for node, facts := range tt.nodes {
				inv := invs[node]
				if inv == nil {
					t.Fatalf("node %s missing", node)
				}
				if inv.Problems != nil {
					t.Errorf("%s: problems %+v", node, inv.Problems)
				}
				if inv.DriverVersion != "580.65.06" || inv.CUDADriverVersion != "13.0" {
					t.Errorf("%s: versions %q/%q, want 580.65.06/13.0", node, inv.DriverVersion, inv.CUDADriverVersion)
				}
				if want := (hardware.Majors{NVIDIA: 195, UVM: sim.UVMMajor, Caps: sim.CapsMajor, IMEXChannels: sim.IMEXChannelsMajor}); inv.Majors != want {
					t.Errorf("%s: majors %+v, want %+v", node, inv.Majors, want)
				}
				if len(inv.GPUs) != 8 {
					t.Fatalf("%s: %d GPUs, want 8", node, len(inv.GPUs))
				}
				busIDs := map[string]bool{}
				for i, g := range inv.GPUs {
					if g.Index != i || g.Minor != i {
						t.Errorf("%s GPU %d: index %d minor %d", node, i, g.Index, g.Minor)
					}
					if g.ProductName != facts.product || g.Architecture != facts.arch || g.CUDAComputeCapability != facts.cc || g.Brand != "Nvidia" {
						t.Errorf("%s GPU %d: got %q %q %q %q, want %q %q %q Nvidia", node, i,
							g.ProductName, g.Architecture, g.CUDAComputeCapability, g.Brand, facts.product, facts.arch, facts.cc)
					}
					if g.MemoryBytes != facts.memoryMiB*mib {
						t.Errorf("%s GPU %d: memory %d MiB, want %d", node, i, g.MemoryBytes/mib, facts.memoryMiB)
					}
					if !busIDRE.MatchString(g.PCIBusID) || busIDs[g.PCIBusID] {
						t.Errorf("%s GPU %d: bus ID %q malformed or duplicate", node, i, g.PCIBusID)
					}
					busIDs[g.PCIBusID] = true
					if !uuidRE.MatchString(g.UUID) {
						t.Errorf("%s GPU %d: UUID %q is not a version 5 GPU UUID", node, i, g.UUID)
					}
					// The same machine in two fleets keeps its UUIDs;
					// different machines never share one.
					key := node + "/" + fmt.Sprint(i)
					if prev, ok := seenUUIDs[g.UUID]; ok && prev != key {
						t.Errorf("%s GPU %d: UUID %s also used by %s", node, i, g.UUID, prev)
					}
					seenUUIDs[g.UUID] = key
					if g.NUMANode == nil || *g.NUMANode != facts.numa[i] {
						t.Errorf("%s GPU %d: NUMA node %s, want %d", node, i, numaString(g.NUMANode), facts.numa[i])
					}
					if !g.MIGCapable {
						t.Errorf("%s GPU %d: not MIG capable", node, i)
					}
					wantMIGs := 0
					if tt.migs[node] != nil {
						wantMIGs = tt.migs[node][i]
					}
					if len(g.MIGDevices) != max(wantMIGs, 0) || g.MIGEnabled != (wantMIGs != 0) {
						t.Errorf("%s GPU %d: MIG enabled %v with %d devices, want %d", node, i, g.MIGEnabled, len(g.MIGDevices), wantMIGs)
					}
				}
				for i := 0; i < 8; i += 2 {
					a, b := inv.GPUs[i].PCIeRoot, inv.GPUs[i+1].PCIeRoot
					if a == "" || a != b {
						t.Errorf("%s GPUs %d and %d: PCIe roots %q and %q, want one shared root", node, i, i+1, a, b)
					}
					if i > 0 && a == inv.GPUs[i-1].PCIeRoot {
						t.Errorf("%s GPUs %d and %d: pairs share root %q", node, i-1, i, a)
					}
				}
			}
		})
	}
}

func numaString(n *int) string {
	if n == nil {
		return "none"
	}
	return fmt.Sprint(*n)
}

func TestDiscoveryIsDeterministic(t *testing.T) {
	for _, name := range simfleet.BuiltinNames() {
		first, second := discover(t, name), discover(t, name)
		if !reflect.DeepEqual(first, second) {
			t.Errorf("%s: two loads discover different inventories", name)
		}
	}
}

func TestMIGDevices(t *testing.T) {
	// dgx-a100-mig GPU 1 (minor 1) holds mig-parted's all-balanced layout.
	inv := discover(t, "dgx-a100-mig")["dgx-a100-0"]
	got := inv.GPUs[1].MIGDevices
	// capMinor is the driver's mig-minors numbering for GPU minor 1.
	capMinor := func(gi int) int { return 3 + 135 + 9*gi }
	want := []hardware.MIGDevice{
		{Profile: "1g.5gb", GIProfileID: 0, ProfileID: 19, CIProfileID: 0, GIID: 9, PlacementStart: 2, PlacementSize: 1,
			MemoryBytes: 4864 * mib, Multiprocessors: 14, CopyEngines: 1},
		{Profile: "1g.5gb", GIProfileID: 0, ProfileID: 19, CIProfileID: 0, GIID: 10, PlacementStart: 3, PlacementSize: 1,
			MemoryBytes: 4864 * mib, Multiprocessors: 14, CopyEngines: 1},
		{Profile: "2g.10gb", GIProfileID: 1, ProfileID: 14, CIProfileID: 1, GIID: 3, PlacementStart: 0, PlacementSize: 2,
			MemoryBytes: 9856 * mib, Multiprocessors: 28, CopyEngines: 2, Decoders: 1},
		{Profile: "3g.20gb", GIProfileID: 2, ProfileID: 9, CIProfileID: 2, GIID: 2, PlacementStart: 4, PlacementSize: 4,
			MemoryBytes: 19968 * mib, Multiprocessors: 42, CopyEngines: 3, Decoders: 2},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d MIG devices, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		want[i].UUID = got[i].UUID
		want[i].GICapMinor, want[i].CICapMinor = capMinor(want[i].GIID), capMinor(want[i].GIID)+1
		if !strings.HasPrefix(got[i].UUID, "MIG-") {
			t.Errorf("MIG device %d: UUID %q", i, got[i].UUID)
		}
		if got[i] != want[i] {
			t.Errorf("MIG device %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}

	// The +me profile and an H100 7g: engines and names as nvidia-smi shows.
	demo := discover(t, "demo")["dgx-h100-0"]
	var me *hardware.MIGDevice
	for i, m := range demo.GPUs[6].MIGDevices {
		if m.Profile == "1g.10gb+me" {
			me = &demo.GPUs[6].MIGDevices[i]
		}
	}
	if me == nil || me.GIProfileID != 7 || me.ProfileID != 20 || me.OFAEngines != 1 || me.JPEGEngines != 1 || me.GIID != 10 {
		t.Errorf("1g.10gb+me: got %+v", me)
	}
}

func TestHandWrittenFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "small.yaml")
	const file = `
nodes:
- name: small
  driverVersion: "570.124.06"
  cudaDriverVersion: "12.8"
  gpus:
  - model: L40S
  - model: H200-SXM5-141GB
    minor: 3
    uuid: GPU-01234567-89ab-4cde-8f01-23456789abcd
    pciBusID: "0000:3B:00.0"
    pcieRoot: pci0000:3a
    numaNode: -1
    migEnabled: true
    migDevices:
    - profile: 7g.141gb
`
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	inv := discover(t, path)["small"]
	if inv.DriverVersion != "570.124.06" || inv.CUDADriverVersion != "12.8" {
		t.Errorf("versions: %q %q", inv.DriverVersion, inv.CUDADriverVersion)
	}
	l40s, h200 := inv.GPUs[0], inv.GPUs[1]
	if l40s.MIGCapable || l40s.Architecture != "Ada Lovelace" || l40s.CUDAComputeCapability != "8.9" || l40s.MemoryBytes != 46068*mib {
		t.Errorf("L40S: %+v", l40s)
	}
	if h200.Minor != 3 || h200.UUID != "GPU-01234567-89ab-4cde-8f01-23456789abcd" || h200.PCIBusID != "0000:3b:00.0" ||
		h200.PCIeRoot != "pci0000:3a" || h200.NUMANode != nil {
		t.Errorf("H200 overrides not honoured: %+v", h200)
	}
	if len(h200.MIGDevices) != 1 || h200.MIGDevices[0].Profile != "7g.141gb" || h200.MIGDevices[0].GIID != 0 ||
		h200.MIGDevices[0].GICapMinor != 3+3*135 || h200.MIGDevices[0].Multiprocessors != 132 {
		t.Errorf("H200 MIG devices: %+v", h200.MIGDevices)
	}
}

func TestConcurrentDiscover(t *testing.T) {
	f, err := simfleet.Load("demo")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := f.Node("dgx-h100-0")
	hw := n.Hardware()
	want, err := hw.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			got, err := hw.Discover(context.Background())
			if err != nil || !reflect.DeepEqual(got, want) {
				t.Errorf("concurrent Discover: err %v, equal %v", err, reflect.DeepEqual(got, want))
			}
		})
	}
	wg.Wait()
}

func TestHardwareOfInvalidNode(t *testing.T) {
	n := &sim.Node{Name: "bad", GPUs: []sim.GPU{{Model: "V100"}}}
	_, err := n.Hardware().Discover(context.Background())
	if err == nil || !strings.Contains(err.Error(), `gpus[0].model: unknown model "V100"`) {
		t.Errorf("got %v", err)
	}
}

// A GPU instance split into compute instances smaller than itself makes
// MIG devices that discovery reports instead of publishing; the GPU's
// other MIG devices are published.
func TestPartialComputeInstances(t *testing.T) {
	path := filepath.Join(t.TempDir(), "split.yaml")
	const file = `
nodes:
- name: split
  gpus:
  - model: H100-SXM5-80GB
    migEnabled: true
    migDevices:
    - {profile: 2g.20gb, placementStart: 0, computeSlices: 1}
    - {profile: 1g.10gb, placementStart: 2}
    - {profile: 3g.40gb, placementStart: 4, computeSlices: 2}
  - model: H100-SXM5-80GB
`
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := simfleet.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	fleetGPU := f.Nodes[0].GPUs[0]
	if got := fleetGPU.MIGDevices[1].ComputeSlices; got != 1 {
		t.Errorf("default computeSlices of 1g.10gb: got %d, want 1", got)
	}
	inv := discover(t, path)["split"]
	if len(inv.GPUs) != 2 {
		t.Fatalf("got %d GPUs, want 2", len(inv.GPUs))
	}
	g := inv.GPUs[0]
	if len(g.MIGDevices) != 1 || g.MIGDevices[0].Profile != "1g.10gb" || g.MIGDevices[0].UUID != fleetGPU.MIGDevices[1].UUID {
		t.Errorf("published MIG devices %+v, want only the 1g.10gb", g.MIGDevices)
	}
	// Two 1c.2g.20gb instances in GI 3, one 2c.3g.40gb in GI 2.
	wantCIs := []string{"CI 0 has 1 of the 2 compute slices of GI 3", "CI 1 has 1 of the 2 compute slices of GI 3",
		"CI 0 has 2 of the 3 compute slices of GI 2"}
	if len(inv.Problems) != len(wantCIs) {
		t.Fatalf("problems %+v, want %d", inv.Problems, len(wantCIs))
	}
	seen := map[string]bool{}
	for i, p := range inv.Problems {
		if p.Index != 0 || p.UUID != g.UUID || !strings.HasPrefix(p.MIGDevice, "MIG-") || seen[p.MIGDevice] {
			t.Errorf("problem %d: %+v, want GPU 0's with a MIG UUID of its own", i, p)
		}
		seen[p.MIGDevice] = true
		if want := "partial compute instances are not supported: " + wantCIs[i]; !strings.HasSuffix(p.Err, want) {
			t.Errorf("problem %d says %q, want ...%q", i, p.Err, want)
		}
	}
	if inv.Problems[0].MIGDevice != fleetGPU.MIGDevices[0].UUID || inv.Problems[2].MIGDevice != fleetGPU.MIGDevices[2].UUID {
		t.Errorf("the first compute instance of a GPU instance does not carry the fleet's UUID: %+v", inv.Problems)
	}
}

// TestBoundToVFIO: a GPU the fleet file marks bound to vfio-pci at start
// is not listed by NVML (the indices after it shift, the minors stay), and
// the node's sysfs shows it bound to vfio-pci with driver_override set.
func TestBoundToVFIO(t *testing.T) {
	f, err := simfleet.Parse([]byte("nodes:\n- name: node-b\n  gpus:\n  - model: H100-SXM5-80GB\n  - model: H100-SXM5-80GB\n    boundTo: vfio-pci\n  - model: H100-SXM5-80GB\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	n := f.Nodes[0]
	inv, err := n.Hardware().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) != 2 || inv.GPUs[1].Index != 1 || inv.GPUs[1].Minor != 2 {
		t.Fatalf("NVML lists %+v, want GPUs of minors 0 and 2 at indices 0 and 1", inv.GPUs)
	}
	fs, err := n.Sysfs()
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := fs.Binding(n.GPUs[1].PCIBusID); b.Driver != "vfio-pci" || b.Override != "vfio-pci" {
		t.Errorf("GPU 1 in sysfs: %+v, want vfio-pci with driver_override vfio-pci", b)
	}
	if b, _ := fs.Binding(n.GPUs[0].PCIBusID); b.Driver != "nvidia" {
		t.Errorf("GPU 0 in sysfs: %+v, want nvidia", b)
	}
	if _, err := simfleet.Parse([]byte("nodes:\n- name: node-b\n  gpus:\n  - model: H100-SXM5-80GB\n    boundTo: nouveau\n"), "test"); err == nil || !strings.Contains(err.Error(), "gpus[0].boundTo") {
		t.Errorf("boundTo nouveau: %v, want an error naming gpus[0].boundTo", err)
	}
}
