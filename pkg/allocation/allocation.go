// Package allocation runs the scheduler's own DRA allocator
// (k8s.io/dynamic-resource-allocation/structured) in process, fed as
// kube-scheduler's DynamicResources plugin feeds it: `gpudra explain`, the
// chaos harness and the tests that allocate from gpudra's slices share it.
package allocation

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

// Features are the scheduler's DRA features as Kubernetes 1.37 enables them
// by default (k8s.io/kubernetes pkg/features at v1.37.1): admin access,
// prioritized lists and device taints are GA; partitionable devices,
// binding conditions, consumable capacity and fractional capacity ranges
// beta.
var Features = structured.Features{
	AdminAccess:             true,
	PrioritizedList:         true,
	PartitionableDevices:    true,
	DeviceTaints:            true,
	DeviceBindingAndStatus:  true,
	ConsumableCapacity:      true,
	FractionalCapacityRange: true,
}

// Classes serves DeviceClasses to the allocator
// ([structured.DeviceClassLister]).
type Classes []*resourceapi.DeviceClass

// List implements [structured.DeviceClassLister].
func (l Classes) List() ([]*resourceapi.DeviceClass, error) { return l, nil }

// Get implements [structured.DeviceClassLister].
func (l Classes) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

// NewState returns an empty allocated state.
func NewState() structured.AllocatedState {
	return structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
}

// Hold records in st what one allocation result holds, as kube-scheduler's
// DynamicResources plugin does: nothing for a device given with admin
// access, a share (and the capacity it consumes) for a result with a share
// ID, the whole device otherwise.
func Hold(st *structured.AllocatedState, r *resourceapi.DeviceRequestAllocationResult) {
	if ptr.Deref(r.AdminAccess, false) {
		return
	}
	id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
	if r.ShareID == nil {
		st.AllocatedDevices.Insert(id)
		return
	}
	st.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
	if r.ConsumedCapacity != nil {
		st.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
	}
}

// StateOf is the allocated state of the allocations.
func StateOf(allocations ...*resourceapi.AllocationResult) structured.AllocatedState {
	st := NewState()
	for _, a := range allocations {
		for i := range a.Devices.Results {
			Hold(&st, &a.Devices.Results[i])
		}
	}
	return st
}

// Allocate allocates one claim on the node called node from slices, given
// what the allocations already hold: nil when it does not fit.
func Allocate(ctx context.Context, features structured.Features, classes Classes, celCache *cel.Cache, slices []*resourceapi.ResourceSlice,
	allocated []*resourceapi.AllocationResult, node string, claim *resourceapi.ResourceClaim) (*resourceapi.AllocationResult, error) {
	a, err := structured.NewAllocator(ctx, features, StateOf(allocated...), classes, slices, celCache)
	if err != nil {
		return nil, err
	}
	results, err := a.Allocate(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, []*resourceapi.ResourceClaim{claim})
	if err != nil || results == nil {
		return nil, err
	}
	return &results[0], nil
}
