package devicemodel_test

import (
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// A GPU published with properties discovery could not read publishes no
// attribute or capacity for them (never "" or 0), and is not offered in
// the ways that need them: shares divide its memory, VFIO binds its PCI
// function, and the counters that keep a VFIO device or MIG placements
// apart from the full GPU hold its memory.
func TestBuildWithUnreadProperties(t *testing.T) {
	unknownMemory := func(g *hardware.GPU) { g.MemoryBytes = 0 }
	unknownBusID := func(g *hardware.GPU) { g.PCIBusID, g.PCIeRoot, g.NUMANode = "", "", nil }
	memoryCompute := devicemodel.Sharing{Mode: devicemodel.SharingMemoryCompute}
	tests := []struct {
		name   string
		model  string
		unread func(g *hardware.GPU)
		opts   []devicemodel.Option
		// names are the devices published.
		names []string
	}{
		{name: "nothing but the identity", model: "H100-SXM5-80GB", unread: func(g *hardware.GPU) {
			g.Brand, g.Architecture, g.CUDAComputeCapability = "", "", ""
			unknownMemory(g)
			unknownBusID(g)
			g.MIGCapable, g.MIGProfiles, g.MIGMemorySlices = false, nil, 0
		}, opts: []devicemodel.Option{devicemodel.WithSharing(devicemodel.Sharing{Mode: devicemodel.SharingShares, Shares: 4}), vfioFor(devicemodel.VFIOBeside)},
			names: []string{"gpu-0"}},
		{name: "memory, shared by memory", model: "L40S", unread: unknownMemory,
			opts: []devicemodel.Option{devicemodel.WithSharing(memoryCompute)}, names: []string{"gpu-0"}},
		{name: "memory, shared unlimited", model: "L40S", unread: unknownMemory,
			opts: []devicemodel.Option{devicemodel.WithSharing(devicemodel.Sharing{Mode: devicemodel.SharingUnlimited})}, names: []string{"gpu-0"}},
		{name: "memory, VFIO beside", model: "L40S", unread: unknownMemory,
			opts: []devicemodel.Option{vfioFor(devicemodel.VFIOBeside)}, names: []string{"gpu-0"}},
		// Only the device itself: no counters to hold the memory.
		{name: "memory, VFIO only", model: "L40S", unread: unknownMemory,
			opts: []devicemodel.Option{vfioFor(devicemodel.VFIOOnly)}, names: []string{"gpu-vfio-0"}},
		// Profiles without the memory their counter set holds: discovery
		// does not report them so, but the model does not count on it.
		{name: "memory, dynamic MIG", model: "H100-SXM5-80GB", unread: unknownMemory,
			opts: []devicemodel.Option{devicemodel.WithDynamicMIG(), vfioFor(devicemodel.VFIOBeside)}, names: []string{"gpu-0"}},
		{name: "bus ID, VFIO beside", model: "L40S", unread: unknownBusID,
			opts: []devicemodel.Option{vfioFor(devicemodel.VFIOBeside)}, names: []string{"gpu-0"}},
		{name: "bus ID, VFIO only", model: "L40S", unread: unknownBusID,
			opts: []devicemodel.Option{vfioFor(devicemodel.VFIOOnly)}, names: []string{"gpu-0"}},
	}
	// The attributes fed by what may be unread, and the capacities.
	fed := []resourceapi.QualifiedName{devicemodel.AttrBrand, devicemodel.AttrArchitecture, devicemodel.AttrCUDAComputeCapability,
		deviceattribute.StandardDeviceAttributePCIBusID, deviceattribute.StandardDeviceAttributePCIeRoot, deviceattribute.StandardDeviceAttributeNUMANode}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := simGPU(t, 0, tt.model, false)
			g.Architecture, g.PCIeRoot, g.NUMANode = "Hopper", "pci0000:15", new(int)
			tt.unread(&g)
			m, err := devicemodel.Build(inventoryOf(g), tt.opts...)
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			var names []string
			for _, d := range m.Devices {
				names = append(names, d.Name())
				for _, name := range fed {
					if _, ok := d.API.Attributes[name]; ok && attrEmpty(d.API.Attributes[name]) {
						t.Errorf("%s: attribute %s published empty", d.Name(), name)
					}
				}
				if g.Brand == "" && hasAny(d.API.Attributes, devicemodel.AttrBrand, devicemodel.AttrArchitecture, devicemodel.AttrCUDAComputeCapability) {
					t.Errorf("%s: attributes %v, want no brand, architecture or compute capability", d.Name(), d.API.Attributes)
				}
				if g.PCIBusID == "" && hasAny(d.API.Attributes, fed[3:]...) {
					t.Errorf("%s: attributes %v, want no PCI bus ID, PCIe root or NUMA node", d.Name(), d.API.Attributes)
				}
				if _, ok := d.API.Capacity[devicemodel.CapMemory]; ok && g.MemoryBytes == 0 {
					t.Errorf("%s: memory capacity %v published for an unknown memory", d.Name(), d.API.Capacity[devicemodel.CapMemory].Value)
				}
				if d.Sharing.Enabled() || d.API.AllowMultipleAllocations != nil || d.API.ConsumesCounters != nil {
					t.Errorf("%s: shared %v (allowMultipleAllocations %v), consumes %v; want unshared and no counters", d.Name(), d.Sharing, d.API.AllowMultipleAllocations, d.API.ConsumesCounters)
				}
				if v := d.API.Attributes[devicemodel.AttrSharingMode].StringValue; d.Kind == devicemodel.KindGPU && (v == nil || *v != string(devicemodel.SharingNone)) {
					t.Errorf("%s: sharingMode %v, want none", d.Name(), v)
				}
				for _, err := range validateDevice(d.API) {
					t.Error(err)
				}
			}
			if !slices.Equal(names, tt.names) || m.CounterSets != nil {
				t.Errorf("devices %q and counter sets %v, want %q and none", names, m.CounterSets, tt.names)
			}
		})
	}
}

func attrEmpty(a resourceapi.DeviceAttribute) bool {
	return (a.StringValue != nil && *a.StringValue == "") || (a.VersionValue != nil && *a.VersionValue == "")
}

func hasAny(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, names ...resourceapi.QualifiedName) bool {
	for _, n := range names {
		if _, ok := attrs[n]; ok {
			return true
		}
	}
	return false
}
