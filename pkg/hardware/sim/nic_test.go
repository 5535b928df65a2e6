package sim_test

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// TestBuiltinNICsShareGPURoots: every DGX H100 or H200 of the built-in
// fleets has eight ConnectX-7, NIC i under the PCIe root that discovery
// reports (and gpudra publishes) for GPU i, on its NUMA node; the other
// nodes have none.
func TestBuiltinNICsShareGPURoots(t *testing.T) {
	tests := []struct {
		fleet    string
		withNICs []string
	}{
		{"dgx-h100", []string{"dgx-h100-0"}},
		{"dgx-h200", []string{"dgx-h200-0"}},
		{"demo", []string{"dgx-h100-0", "dgx-h100-1"}},
		{"dgx-a100", nil},
	}
	for _, tt := range tests {
		t.Run(tt.fleet, func(t *testing.T) {
			f, err := simfleet.Load(tt.fleet)
			if err != nil {
				t.Fatal(err)
			}
			inventories := discover(t, tt.fleet)
			for _, node := range f.Nodes {
				want := 0
				for _, n := range tt.withNICs {
					if n == node.Name {
						want = 8
					}
				}
				if len(node.NICs) != want {
					t.Fatalf("%s: %d NICs, want %d", node.Name, len(node.NICs), want)
				}
				gpus := inventories[node.Name].GPUs
				busIDs := map[string]string{}
				for i, g := range gpus {
					busIDs[g.PCIBusID] = fmt.Sprintf("GPU %d", i)
				}
				for i, nic := range node.NICs {
					if nic.Model != "ConnectX-7" || nic.LinkType != sim.LinkInfiniBand || nic.SpeedGbps != 400 {
						t.Errorf("%s NIC %d: %s %s %d Gb/s, want ConnectX-7 infiniband 400 Gb/s", node.Name, i, nic.Model, nic.LinkType, nic.SpeedGbps)
					}
					if nic.PCIeRoot != gpus[i].PCIeRoot {
						t.Errorf("%s NIC %d: PCIe root %s, GPU %d's is %s", node.Name, i, nic.PCIeRoot, i, gpus[i].PCIeRoot)
					}
					if nic.NUMANode == nil || gpus[i].NUMANode == nil || *nic.NUMANode != *gpus[i].NUMANode {
						t.Errorf("%s NIC %d: NUMA node %s, GPU %d's is %s", node.Name, i, numaString(nic.NUMANode), i, numaString(gpus[i].NUMANode))
					}
					if other, dup := busIDs[nic.PCIBusID]; dup || nic.PCIBusID == "" {
						t.Errorf("%s NIC %d: bus ID %q (also %s's)", node.Name, i, nic.PCIBusID, other)
					}
					busIDs[nic.PCIBusID] = fmt.Sprintf("NIC %d", i)
				}
			}
		})
	}
}

// TestHandWrittenNICs: what a fleet file says of a NIC is kept, and what it
// leaves out is filled in: the model's speed, InfiniBand, and the NUMA node
// of a GPU under the same root (none where no GPU is).
func TestHandWrittenNICs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nics.yaml")
	const file = `
nodes:
- name: n0
  gpus:
  - {model: L40S, pcieRoot: pci0000:3a, numaNode: 2}
  nics:
  - {model: ConnectX-8, pcieRoot: pci0000:3a}
  - {model: BlueField-3, pcieRoot: pci0001:80, linkType: ethernet, speedGbps: 200, pciBusID: "0001:8A:00.1", numaNode: 5}
  - {model: ConnectX-6, pcieRoot: pci0000:c0}
`
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := simfleet.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	numa := func(n int) *int { return &n }
	want := []sim.NIC{
		{Model: "ConnectX-8", PCIeRoot: "pci0000:3a", LinkType: "infiniband", SpeedGbps: 800, NUMANode: numa(2)},
		{Model: "BlueField-3", PCIeRoot: "pci0001:80", LinkType: "ethernet", SpeedGbps: 200, PCIBusID: "0001:8a:00.1", NUMANode: numa(5)},
		{Model: "ConnectX-6", PCIeRoot: "pci0000:c0", LinkType: "infiniband", SpeedGbps: 200, NUMANode: numa(-1)},
	}
	if got := f.Nodes[0].NICs; !reflect.DeepEqual(got, want) {
		t.Errorf("NICs\n%+v\nwant\n%+v", got, want)
	}
}
