package devicemodel_test

import (
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// TestBuildGPUBoundToVFIO: a GPU the node's set-up bound to a VFIO driver
// (known by its PCI function only) is published as its VFIO device alone,
// without counters, UUID or product name, in either VFIO mode and whatever
// sharing or MIG the node offers; without passthrough, not at all.
func TestBuildGPUBoundToVFIO(t *testing.T) {
	bound := hardware.GPU{Index: 1, Minor: 1, PCIBusID: "0000:43:00.0", VFIODriver: "vfio-pci"}
	inv := &hardware.Inventory{DriverVersion: "580.65.06", CUDADriverVersion: "13.0", GPUs: []hardware.GPU{bound}}
	sharing := devicemodel.WithSharing(devicemodel.Sharing{Mode: devicemodel.SharingShares, Shares: 4})
	for _, tc := range []struct {
		name  string
		opts  []devicemodel.Option
		names []string
	}{
		{"beside", []devicemodel.Option{vfioFor(devicemodel.VFIOBeside), devicemodel.WithDynamicMIG(), sharing}, []string{"gpu-vfio-1"}},
		{"only", []devicemodel.Option{vfioFor(devicemodel.VFIOOnly)}, []string{"gpu-vfio-1"}},
		{"no passthrough", []devicemodel.Option{sharing}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := devicemodel.Build(inv, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, d := range m.Devices {
				names = append(names, d.Name())
				if len(d.API.ConsumesCounters) != 0 || len(m.CounterSets) != 0 {
					t.Errorf("%s consumes %v of %v, want no counters", d.Name(), d.API.ConsumesCounters, m.CounterSets)
				}
				for _, attr := range []resourceapi.QualifiedName{devicemodel.AttrUUID, devicemodel.AttrProductName} {
					if _, ok := d.API.Attributes[attr]; ok {
						t.Errorf("%s has attribute %s, which NVML never told", d.Name(), attr)
					}
				}
				for _, err := range validateDevice(d.API) {
					t.Error(err)
				}
			}
			if !slices.Equal(names, tc.names) {
				t.Errorf("devices %v, want %v", names, tc.names)
			}
		})
	}
}
