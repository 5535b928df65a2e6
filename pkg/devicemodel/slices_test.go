package devicemodel_test

import (
	"fmt"
	"reflect"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// plainDevices returns n devices without advanced features, named in order.
func plainDevices(n int) []resourceapi.Device {
	out := make([]resourceapi.Device, n)
	for i := range out {
		out[i] = resourceapi.Device{
			Name: fmt.Sprintf("dev-%03d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"index": {IntValue: ptr.To(int64(i))},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: resource.MustParse("80Gi")},
			},
		}
	}
	return out
}

// The ways one device can make a whole slice "advanced" (taints, counter
// consumption, list-type attributes), and so halve the device limit.
// The API counts every list type (k8s.io/kubernetes
// pkg/apis/resource/validation, haveListAttributes).
var advanced = []struct {
	feature string
	apply   func(*resourceapi.Device)
}{
	{"taint", func(d *resourceapi.Device) {
		d.Taints = []resourceapi.DeviceTaint{{Key: "gpu.nvidia.com/xid", Value: "79", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	}},
	{"counters", func(d *resourceapi.Device) {
		d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{
			CounterSet: "gpu-0-counters",
			Counters:   map[string]resourceapi.Counter{"memory-slice-0": {Value: resource.MustParse("1")}},
		}}
	}},
	{"int list", func(d *resourceapi.Device) {
		d.Attributes["resource.kubernetes.io/numaNode"] = resourceapi.DeviceAttribute{IntValues: []int64{0, 1}}
	}},
	{"bool list", func(d *resourceapi.Device) {
		d.Attributes["flags"] = resourceapi.DeviceAttribute{BoolValues: []bool{true}}
	}},
	{"string list", func(d *resourceapi.Device) {
		d.Attributes["resource.kubernetes.io/pcieRoot"] = resourceapi.DeviceAttribute{StringValues: []string{"pci0000:15", "pci0000:16"}}
	}},
	{"version list", func(d *resourceapi.Device) {
		d.Attributes["supportedCUDA"] = resourceapi.DeviceAttribute{VersionValues: []string{"12.8.0", "13.0.0"}}
	}},
}

func sliceSizes(s []resourceslice.Slice) []int {
	sizes := make([]int, len(s))
	for i := range s {
		sizes[i] = len(s[i].Devices)
	}
	return sizes
}

func TestSlices(t *testing.T) {
	type tc struct {
		name      string
		devices   []resourceapi.Device
		wantLimit int
		wantSizes []int
	}
	tests := []tc{
		{"no devices", nil, resourceapi.ResourceSliceMaxDevices, []int{0}},
		{"one", plainDevices(1), 128, []int{1}},
		{"exactly 128", plainDevices(128), 128, []int{128}},
		{"129", plainDevices(129), 128, []int{128, 1}},
		{"130", plainDevices(130), 128, []int{128, 2}},
		{"257", plainDevices(257), 128, []int{128, 128, 1}},
	}
	for _, a := range advanced {
		for _, at := range []int{0, 129} {
			devices := plainDevices(130)
			a.apply(&devices[at])
			tests = append(tests, tc{fmt.Sprintf("130 with %s on device %d", a.feature, at), devices, 64, []int{64, 64, 2}})
		}
		devices := plainDevices(64)
		a.apply(&devices[63])
		tests = append(tests, tc{fmt.Sprintf("64 with %s", a.feature), devices, 64, []int{64}})
		devices = plainDevices(65)
		a.apply(&devices[10])
		tests = append(tests, tc{fmt.Sprintf("65 with %s", a.feature), devices, 64, []int{64, 1}})
	}
	// Scalar attributes of every type are not advanced.
	scalars := plainDevices(130)
	scalars[5].Attributes["brand"] = resourceapi.DeviceAttribute{StringValue: ptr.To("Nvidia")}
	scalars[6].Attributes["driverVersion"] = resourceapi.DeviceAttribute{VersionValue: ptr.To("580.65.6")}
	scalars[7].Attributes["vfio"] = resourceapi.DeviceAttribute{BoolValue: ptr.To(false)}
	tests = append(tests, tc{"130 with scalar attributes of every type", scalars, 128, []int{128, 2}})

	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			input := slices.Clone(tt.devices)
			if got := devicemodel.SliceLimit(tt.devices); got != tt.wantLimit {
				t.Errorf("SliceLimit = %d, want %d", got, tt.wantLimit)
			}
			got := devicemodel.Slices(tt.devices)
			if sizes := sliceSizes(got); !slices.Equal(sizes, tt.wantSizes) {
				t.Fatalf("slice sizes %v, want %v", sizes, tt.wantSizes)
			}
			// Concatenated, the slices are the input in input order.
			var names []string
			for _, s := range got {
				if s.Devices == nil {
					t.Error("a slice has nil Devices; the API needs an empty list for an empty pool")
				}
				for _, d := range s.Devices {
					names = append(names, d.Name)
				}
			}
			var want []string
			for _, d := range input {
				want = append(want, d.Name)
			}
			if !slices.Equal(names, want) {
				t.Errorf("devices out of order or lost:\n got %v\nwant %v", names, want)
			}
			if !reflect.DeepEqual(tt.devices, input) {
				t.Error("Slices modified its input")
			}
			// Determinism.
			if again := devicemodel.Slices(tt.devices); !reflect.DeepEqual(again, got) {
				t.Error("two calls differ")
			}
		})
	}
}

// TestSlicesDoNotAlias makes sure a consumer appending to one slice's
// devices cannot overwrite the first device of the next slice.
func TestSlicesDoNotAlias(t *testing.T) {
	got := devicemodel.Slices(plainDevices(130))
	_ = append(got[0].Devices, resourceapi.Device{Name: "intruder"})
	if name := got[1].Devices[0].Name; name != "dev-128" {
		t.Errorf("second slice starts with %q after appending to the first, want dev-128", name)
	}
}

// TestSlicesOfLargeNode chunks the devices of a real (simulated) node with
// more than 128 devices: 19 GPUs with seven 1g.10gb MIG devices each.
func TestSlicesOfLargeNode(t *testing.T) {
	fleet := "nodes:\n- name: big-node\n  gpus:\n"
	for i := 0; i < 19; i++ {
		fleet += "  - model: H100-SXM5-80GB\n    migEnabled: true\n    migDevices:\n"
		for s := 0; s < 7; s++ {
			fleet += fmt.Sprintf("    - {profile: 1g.10gb, placementStart: %d}\n", s)
		}
	}
	inv := discover(t, parsed(fleet)(t), "big-node")
	devices := build(t, inv).APIDevices()
	if len(devices) != 133 {
		t.Fatalf("%d devices, want 133", len(devices))
	}
	got := devicemodel.Slices(devices)
	if sizes := sliceSizes(got); !slices.Equal(sizes, []int{128, 5}) {
		t.Fatalf("slice sizes %v, want [128 5]", sizes)
	}
	if first, last := got[0].Devices[0].Name, got[1].Devices[4].Name; first != "gpu-0-mig-1g10gb-19-0" || last != "gpu-18-mig-1g10gb-19-6" {
		t.Errorf("first and last devices %s, %s", first, last)
	}
	for _, d := range devices {
		for _, err := range validateDevice(d) {
			t.Error(err)
		}
	}
}

func TestDriverResources(t *testing.T) {
	tests := []struct {
		name    string
		devices []resourceapi.Device
		sizes   []int
	}{
		{"empty pool", nil, []int{0}},
		{"two slices", plainDevices(200), []int{128, 72}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := devicemodel.DriverResources("node-a", tt.devices)
			if len(res.Pools) != 1 {
				t.Fatalf("%d pools, want one", len(res.Pools))
			}
			pool, ok := res.Pools["node-a"]
			if !ok {
				t.Fatalf("no pool named after the node: %v", res.Pools)
			}
			if sizes := sliceSizes(pool.Slices); !slices.Equal(sizes, tt.sizes) {
				t.Errorf("slice sizes %v, want %v", sizes, tt.sizes)
			}
		})
	}
}

// TestSlicesEmptyInventory: a node whose driver reports no GPUs still
// publishes one empty slice.
func TestSlicesEmptyInventory(t *testing.T) {
	m := build(t, &hardware.Inventory{DriverVersion: "580.65.06", CUDADriverVersion: "13.0"})
	got := devicemodel.Slices(m.APIDevices())
	if len(got) != 1 || got[0].Devices == nil || len(got[0].Devices) != 0 {
		t.Errorf("Slices of an empty node = %#v, want one slice with an empty device list", got)
	}
}
