package devicemodel_test

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// A GPU's taints go on every device of that GPU, and only there: its MIG
// placements, its full GPU and its VFIO device.
func TestWithTaints(t *testing.T) {
	migGPU, plain := simGPU(t, 0, "H100-SXM5-80GB", true), simGPU(t, 1, "H100-SXM5-80GB", false)
	taint := resourceapi.DeviceTaint{Key: "gpu.nvidia.com/xid", Value: "79", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	for _, tc := range []struct {
		name    string
		tainted hardware.GPU
	}{{"MIG placements", migGPU}, {"full GPU and VFIO device", plain}} {
		t.Run(tc.name, func(t *testing.T) {
			vfio := func(hardware.GPU) (devicemodel.VFIOInfo, bool) {
				return devicemodel.VFIOInfo{VendorID: "0x10de", DeviceID: "0x2330", IOMMUGroup: 7}, true
			}
			m, err := devicemodel.Build(inventoryOf(migGPU, plain), devicemodel.WithDynamicMIG(), devicemodel.WithVFIO(devicemodel.VFIOBeside, vfio),
				devicemodel.WithTaints(func(uuid string) []resourceapi.DeviceTaint {
					if uuid == tc.tainted.UUID {
						return []resourceapi.DeviceTaint{taint}
					}
					return nil
				}))
			if err != nil {
				t.Fatal(err)
			}
			tainted := 0
			for _, d := range m.Devices {
				want := d.GPU.UUID == tc.tainted.UUID
				got := len(d.API.Taints) == 1 && d.API.Taints[0] == taint
				if got != want || (!want && len(d.API.Taints) > 0) {
					t.Errorf("device %s (GPU %s): taints %+v, want tainted %v", d.Name(), d.GPU.UUID, d.API.Taints, want)
				}
				if got {
					tainted++
				}
			}
			if tainted < 2 {
				t.Errorf("%d devices tainted; want the GPU's devices and its VFIO device", tainted)
			}
			if limit := devicemodel.SliceLimit(m.APIDevices()); limit != resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures {
				t.Errorf("slice limit %d with taints", limit)
			}
		})
	}
}
