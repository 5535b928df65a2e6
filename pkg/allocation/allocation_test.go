package allocation

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

const driver = "gpu.nvidia.com"

func testSlices() []*resourceapi.ResourceSlice {
	return []*resourceapi.ResourceSlice{{
		ObjectMeta: metav1.ObjectMeta{Name: "node-0-gpus"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: driver, NodeName: ptr.To("node-0"),
			Pool:    resourceapi.ResourcePool{Name: "node-0", ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "gpu-0"}, {Name: "gpu-1"}},
		},
	}}
}

func testClaim(name string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driver, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}},
	}
}

var testClasses = Classes{{
	ObjectMeta: metav1.ObjectMeta{Name: driver},
	Spec:       resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.nvidia.com"`}}}},
}}

// Two claims get the node's two GPUs, one each; a third does not fit.
func TestAllocateHoldsWhatWasAllocated(t *testing.T) {
	ctx := context.Background()
	celCache := cel.NewCache(10, cel.Features{})
	var live []*resourceapi.AllocationResult
	seen := map[string]bool{}
	for _, name := range []string{"a", "b"} {
		got, err := Allocate(ctx, Features, testClasses, celCache, testSlices(), live, "node-0", testClaim(name))
		if err != nil || got == nil || len(got.Devices.Results) != 1 {
			t.Fatalf("claim %s: %+v, %v; want one device", name, got, err)
		}
		dev := got.Devices.Results[0].Device
		if seen[dev] {
			t.Fatalf("claim %s got %s, which another claim holds", name, dev)
		}
		seen[dev] = true
		live = append(live, got)
	}
	if got, err := Allocate(ctx, Features, testClasses, celCache, testSlices(), live, "node-0", testClaim("c")); err != nil || got != nil {
		t.Errorf("third claim: %+v, %v; want no fit", got, err)
	}
	if _, err := testClasses.Get("nosuch"); err == nil {
		t.Error("Classes.Get of a missing class succeeded")
	}
}

// Hold: a device given with admin access holds nothing, a share holds its
// share and its capacity, anything else the whole device.
func TestHold(t *testing.T) {
	st := NewState()
	Hold(&st, &resourceapi.DeviceRequestAllocationResult{Driver: driver, Pool: "p", Device: "admin", AdminAccess: ptr.To(true)})
	Hold(&st, &resourceapi.DeviceRequestAllocationResult{Driver: driver, Pool: "p", Device: "whole"})
	share := types.UID("s1")
	Hold(&st, &resourceapi.DeviceRequestAllocationResult{Driver: driver, Pool: "p", Device: "shared", ShareID: &share,
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("1Gi")}})
	if st.AllocatedDevices.Has(structured.MakeDeviceID(driver, "p", "admin")) {
		t.Error("a device given with admin access is held")
	}
	if !st.AllocatedDevices.Has(structured.MakeDeviceID(driver, "p", "whole")) {
		t.Error("a plain result does not hold its device")
	}
	id := structured.MakeDeviceID(driver, "p", "shared")
	if st.AllocatedDevices.Has(id) || !st.AllocatedSharedDeviceIDs.Has(structured.MakeSharedDeviceID(id, &share)) {
		t.Error("a share holds the whole device, or not its share")
	}
	if len(st.AggregatedCapacity) != 1 {
		t.Errorf("aggregated capacity %v, want the share's", st.AggregatedCapacity)
	}
}
