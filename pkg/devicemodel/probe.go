package devicemodel

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// ProbeSliceName is the name of the ResourceSlice [FeatureProbe] returns.
// It is only ever created as a dry run, so it never clashes.
func ProbeSliceName(driverName, nodeName string) string {
	return "gpudra-feature-probe-" + driverName + "-" + nodeName
}

// FeatureProbe is a ResourceSlice of this node and driver (so that the
// NodeRestriction admission lets the node create it) whose one device
// carries every field a publishing fallback depends on, built as the model
// builds them: counter consumption (DRAPartitionableDevices), a taint
// (DRADeviceTaints), and allowMultipleAllocations with a capacity request
// policy (DRAConsumableCapacity). Created as a dry run, the API server's
// answer shows which of them it drops, before anything is published. The
// counter set the device consumes from is not in the slice (a slice holds
// devices or counter sets, not both); the API server does not check that
// reference.
func FeatureProbe(driverName, nodeName string) *resourceapi.ResourceSlice {
	memory := bytesCapacity(1 << 30)
	memory.RequestPolicy = rangePolicy(memory.Value, resource.MustParse("1Mi"), memory.Value, resource.MustParse("1"))
	device := resourceapi.Device{
		Name: GPUName(0),
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			AttrSharingMode: {StringValue: ptr.To("probe")},
		},
		Capacity:                 map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{CapMemory: memory},
		AllowMultipleAllocations: ptr.To(true),
		ConsumesCounters: []resourceapi.DeviceCounterConsumption{{
			CounterSet: CounterSetName(0),
			Counters:   map[string]resourceapi.Counter{MemorySliceCounter(0): {Value: resource.MustParse("1")}},
		}},
		Taints: []resourceapi.DeviceTaint{{
			Key:    driverName + "/probe",
			Value:  "probe",
			Effect: resourceapi.DeviceTaintEffectNoSchedule,
		}},
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: ProbeSliceName(driverName, nodeName)},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   driverName,
			NodeName: ptr.To(nodeName),
			Pool:     resourceapi.ResourcePool{Name: nodeName, ResourceSliceCount: 1},
			Devices:  []resourceapi.Device{device},
		},
	}
}
