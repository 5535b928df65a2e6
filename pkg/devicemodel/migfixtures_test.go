package devicemodel_test

import (
	"bytes"
	"fmt"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// simModel returns the simulator's model of that name.
func simModel(t testing.TB, name string) sim.Model {
	t.Helper()
	m, ok := sim.LookupModel(name)
	if !ok {
		t.Fatalf("no simulated model %q", name)
	}
	return m
}

// migModels are the simulated models with MIG.
func migModels(t testing.TB) []string {
	var names []string
	for _, name := range sim.ModelNames() {
		if len(simModel(t, name).MIGProfiles) > 0 {
			names = append(names, name)
		}
	}
	if len(names) == 0 {
		t.Fatal("the simulator has no MIG-capable model")
	}
	return names
}

// hardwareProfiles converts a simulated model's MIG profile table into
// the inventory's form, as discovery reports it.
func hardwareProfiles(m sim.Model) []hardware.MIGProfile {
	out := make([]hardware.MIGProfile, len(m.MIGProfiles))
	for i, p := range m.MIGProfiles {
		out[i] = hardware.MIGProfile{
			Name:            p.Name,
			GIProfileID:     p.GIProfile,
			ProfileID:       p.ID,
			CIProfileID:     p.CIProfile,
			Slices:          p.Slices,
			Instances:       p.Instances,
			MemoryBytes:     p.MemoryMiB << 20,
			Multiprocessors: p.Multiprocessors,
			CopyEngines:     p.CopyEngines,
			Decoders:        p.Decoders,
			Encoders:        p.Encoders,
			JPEGEngines:     p.JPEGEngines,
			OFAEngines:      p.OFAEngines,
			PlacementSize:   p.PlacementSize,
			PlacementStarts: slices.Clone(p.PlacementStarts),
		}
	}
	return out
}

// withMIGProfiles fills in the MIG profiles and memory slices of the
// GPUs of a discovered node from the simulator's tables, where discovery
// left them out.
func withMIGProfiles(t testing.TB, inv *hardware.Inventory, node *simfleet.Node) {
	t.Helper()
	if len(inv.GPUs) != len(node.GPUs) {
		t.Fatalf("inventory of %s has %d GPUs, the fleet %d", node.Name, len(inv.GPUs), len(node.GPUs))
	}
	for i := range inv.GPUs {
		g := &inv.GPUs[i]
		m := simModel(t, node.GPUs[i].Model)
		if len(m.MIGProfiles) == 0 || len(g.MIGProfiles) > 0 {
			continue
		}
		g.MIGCapable, g.MIGMemorySlices, g.MIGProfiles = true, m.MemorySlices, hardwareProfiles(m)
	}
}

// discoverMIG discovers a node of a fleet, with MIG profiles.
func discoverMIG(t *testing.T, f *simfleet.Fleet, node string) *hardware.Inventory {
	t.Helper()
	inv := discover(t, f, node)
	n, err := f.Node(node)
	if err != nil {
		t.Fatal(err)
	}
	withMIGProfiles(t, inv, n)
	return inv
}

func buildDynamic(t testing.TB, inv *hardware.Inventory) *devicemodel.Model {
	t.Helper()
	m, err := devicemodel.Build(inv, devicemodel.WithDynamicMIG())
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return m
}

// simGPU is a GPU of a simulated model as discovery reports it, without
// the facts the device model does not need.
func simGPU(t testing.TB, index int, model string, migEnabled bool) hardware.GPU {
	t.Helper()
	m := simModel(t, model)
	g := hardware.GPU{
		Index: index, Minor: index,
		UUID:        fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", index),
		ProductName: m.ProductName, Brand: "Nvidia", CUDAComputeCapability: fmt.Sprintf("%d.%d", m.CCMajor, m.CCMinor),
		MemoryBytes: m.MemoryMiB << 20, PCIBusID: fmt.Sprintf("0000:%02x:00.0", 0x1b+index),
	}
	if len(m.MIGProfiles) > 0 {
		g.MIGCapable, g.MIGEnabled, g.MIGMemorySlices, g.MIGProfiles = true, migEnabled, m.MemorySlices, hardwareProfiles(m)
	}
	return g
}

func inventoryOf(gpus ...hardware.GPU) *hardware.Inventory {
	return &hardware.Inventory{DriverVersion: "580.65.06", CUDADriverVersion: "13.0", GPUs: gpus}
}

// sliceShape describes slices as "N counter sets" or "N devices".
func sliceShape(s []resourceslice.Slice) []string {
	var out []string
	for _, sl := range s {
		switch {
		case sl.SharedCounters != nil && sl.Devices != nil:
			out = append(out, fmt.Sprintf("%d counter sets and %d devices", len(sl.SharedCounters), len(sl.Devices)))
		case sl.SharedCounters != nil:
			out = append(out, fmt.Sprintf("%d counter sets", len(sl.SharedCounters)))
		default:
			out = append(out, fmt.Sprintf("%d devices", len(sl.Devices)))
		}
	}
	return out
}

// counterValues are counters as plain numbers, for comparing.
func counterValues(c map[string]resourceapi.Counter) map[string]int64 {
	out := make(map[string]int64, len(c))
	for name, v := range c {
		out[name] = v.Value.Value()
	}
	return out
}

// equalYAML compares values as the API would see them.
func equalYAML(t *testing.T, a, b any) bool {
	t.Helper()
	ya, err := yaml.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	yb, err := yaml.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ya, yb)
}
