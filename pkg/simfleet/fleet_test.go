package simfleet_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// discover loads a fleet and discovers every node.
func discover(t *testing.T, nameOrPath string) map[string]*hardware.Inventory {
	t.Helper()
	f, err := simfleet.Load(nameOrPath)
	if err != nil {
		t.Fatalf("Load(%q): %v", nameOrPath, err)
	}
	out := map[string]*hardware.Inventory{}
	for _, n := range f.Nodes {
		inv, err := n.Hardware().Discover(context.Background())
		if err != nil {
			t.Fatalf("%s: Discover: %v", n.Name, err)
		}
		out[n.Name] = inv
	}
	return out
}

func TestNodeLookup(t *testing.T) {
	f, err := simfleet.Load("demo")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := f.NodeNames(), []string{"dgx-h100-0", "dgx-h100-1", "dgx-a100-0", "a100-classic", "gb200-0", "gb200-1", "gb200-2", "gb200-3"}; !reflect.DeepEqual(got, want) {
		t.Errorf("NodeNames: got %v, want %v", got, want)
	}
	_, err = f.Node("nope")
	if err == nil || !strings.Contains(err.Error(), "dgx-h100-0, dgx-h100-1, dgx-a100-0, a100-classic, gb200-0, gb200-1, gb200-2, gb200-3") {
		t.Errorf("Node(nope): got %v, want an error listing the nodes", err)
	}
	_, err = simfleet.Load("no-such-fleet")
	if err == nil || !strings.Contains(err.Error(), "dgx-a100-mig") {
		t.Errorf("Load(no-such-fleet): got %v, want an error listing the built-ins", err)
	}
}

func TestFileRoundTrip(t *testing.T) {
	for _, name := range []string{"demo", "vm-quirks"} {
		t.Run(name, func(t *testing.T) { testFileRoundTrip(t, name) })
	}
}

func testFileRoundTrip(t *testing.T, name string) {
	want, err := simfleet.Load(name)
	if err != nil {
		t.Fatal(err)
	}
	// The loaded fleet carries every default; written out and read back
	// it is the same fleet with the same GPUs.
	data, err := yaml.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := simfleet.Load(path)
	if err != nil {
		t.Fatalf("Load(%s): %v\n%s", path, err, data)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("round trip changed the fleet:\n%s", data)
	}
	if a, b := discover(t, name), discover(t, path); !reflect.DeepEqual(a, b) {
		t.Error("round trip changed what is discovered")
	}
}

// TestVMQuirksFleet: a VM without PCIe roots or NUMA affinity and a GB10
// whose NVML leaves memory info and brand unanswered are discovered with
// every GPU, each published without what its node does not tell, and the
// properties named in its Unread.
func TestVMQuirksFleet(t *testing.T) {
	invs := discover(t, "vm-quirks")
	for _, vm := range []struct {
		node      string
		gpus      int
		memoryMiB uint64
		profiles  int
	}{{"azure-nd-h100-v5", 8, 81559, 7}, {"azure-nc-h100-v5", 2, 95830, 7}} {
		inv := invs[vm.node]
		if inv == nil || len(inv.GPUs) != vm.gpus || len(inv.Problems) != 0 {
			t.Fatalf("%s: %+v; want %d GPUs and no problem", vm.node, inv, vm.gpus)
		}
		for _, g := range inv.GPUs {
			if g.PCIeRoot != "" || g.NUMANode != nil {
				t.Errorf("%s GPU %d: PCIe root %q, NUMA node %v; want neither", vm.node, g.Index, g.PCIeRoot, g.NUMANode)
			}
			if len(g.Unread) != 1 || g.Unread[0].Property != hardware.PropertyPCIeRoot || g.Unread[0].Query != "PCIe root of "+g.PCIBusID {
				t.Errorf("%s GPU %d: unread %v, want only its PCIe root", vm.node, g.Index, g.Unread)
			}
			if g.MemoryBytes != vm.memoryMiB<<20 || !g.MIGCapable || len(g.MIGProfiles) != vm.profiles {
				t.Errorf("%s GPU %d: memory %d, MIG capable %v, %d profiles; want the model's", vm.node, g.Index, g.MemoryBytes, g.MIGCapable, len(g.MIGProfiles))
			}
		}
	}
	spark := invs["dgx-spark"]
	if len(spark.GPUs) != 1 || len(spark.Problems) != 0 {
		t.Fatalf("dgx-spark: %d GPUs, problems %v; want 1 and none", len(spark.GPUs), spark.Problems)
	}
	g := spark.GPUs[0]
	want := []hardware.Unread{
		{Property: hardware.PropertyBrand, Query: "nvmlDeviceGetBrand", Err: "ERROR_NOT_SUPPORTED"},
		{Property: hardware.PropertyMemory, Query: "nvmlDeviceGetMemoryInfo", Err: "ERROR_NOT_SUPPORTED"},
	}
	if !reflect.DeepEqual(g.Unread, want) || g.MemoryBytes != 0 || g.Brand != "" || g.ProductName != "NVIDIA GB10" || g.PCIeRoot != "pci000f:00" {
		t.Errorf("dgx-spark GPU: %+v", g)
	}
	for name, inv := range invs {
		m, err := devicemodel.Build(inv)
		if err != nil {
			t.Fatalf("%s: build devices: %v", name, err)
		}
		gpus := 0
		for _, d := range m.Devices {
			if d.Kind == devicemodel.KindGPU {
				gpus++
			}
		}
		if gpus != len(inv.GPUs) {
			t.Errorf("%s: %d GPU devices published, want %d", name, gpus, len(inv.GPUs))
		}
	}
}

// TestCurrentModelsFleet: every GPU of the fleet of current models is
// discovered with its model's figures and published, and a MIG-capable
// model's GPU in MIG mode offers every placement of its MIG table.
func TestCurrentModelsFleet(t *testing.T) {
	f, err := simfleet.Load("current-models")
	if err != nil {
		t.Fatal(err)
	}
	models := map[string]bool{}
	for _, n := range f.Nodes {
		inv, err := n.Hardware().Discover(context.Background())
		if err != nil {
			t.Fatalf("%s: %v", n.Name, err)
		}
		if len(inv.GPUs) != len(n.GPUs) || len(inv.Problems) != 0 {
			t.Fatalf("%s: discovered %d of %d GPUs, problems %v", n.Name, len(inv.GPUs), len(n.GPUs), inv.Problems)
		}
		m, err := devicemodel.Build(inv, devicemodel.WithDynamicMIG())
		if err != nil {
			t.Fatalf("%s: build devices: %v", n.Name, err)
		}
		for i, g := range inv.GPUs {
			model, _ := sim.LookupModel(n.GPUs[i].Model)
			models[model.Name] = true
			cc := fmt.Sprintf("%d.%d", model.CCMajor, model.CCMinor)
			if g.ProductName != model.ProductName || g.MemoryBytes != model.MemoryMiB<<20 || g.CUDAComputeCapability != cc || len(g.Unread) != 0 {
				t.Errorf("%s GPU %d: %q, %d MiB, CC %s, unread %v; want %q, %d MiB, CC %s",
					n.Name, i, g.ProductName, g.MemoryBytes>>20, g.CUDAComputeCapability, g.Unread, model.ProductName, model.MemoryMiB, cc)
			}
			if g.MIGCapable != (len(model.MIGProfiles) > 0) || len(g.MIGProfiles) != len(model.MIGProfiles) {
				t.Errorf("%s GPU %d: MIG capable %v with %d profiles, want %d", n.Name, i, g.MIGCapable, len(g.MIGProfiles), len(model.MIGProfiles))
			}
			wantPlacements := 0
			if g.MIGEnabled {
				for _, p := range model.MIGProfiles {
					wantPlacements += len(p.PlacementStarts)
				}
			}
			var whole, placements int
			for _, d := range m.Devices {
				switch {
				case d.GPU.UUID != g.UUID:
				case d.Kind == devicemodel.KindGPU:
					whole++
				case d.Placement != nil:
					placements++
				}
			}
			if whole != 1 && !g.MIGEnabled {
				t.Errorf("%s GPU %d: %d whole-GPU devices, want 1", n.Name, i, whole)
			}
			if placements != wantPlacements {
				t.Errorf("%s GPU %d: %d MIG placements published, want %d", n.Name, i, placements, wantPlacements)
			}
		}
	}
	t.Logf("models: %v", slices.Sorted(maps.Keys(models)))
}
