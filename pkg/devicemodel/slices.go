package devicemodel

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
)

// SliceLimit returns how many of the given devices one ResourceSlice may
// hold: 128, or 64 as soon as any device uses an advanced feature (taints,
// counter consumption or list-type attributes), as the API validates it.
func SliceLimit(devices []resourceapi.Device) int {
	for i := range devices {
		if usesAdvancedFeatures(&devices[i]) {
			return resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
		}
	}
	return resourceapi.ResourceSliceMaxDevices
}

func usesAdvancedFeatures(d *resourceapi.Device) bool {
	if len(d.Taints) > 0 || len(d.ConsumesCounters) > 0 {
		return true
	}
	for _, a := range d.Attributes {
		if a.IntValues != nil || a.BoolValues != nil || a.StringValues != nil || a.VersionValues != nil {
			return true
		}
	}
	return false
}

// Slices chunks devices, in order, into slices that respect the API's
// per-slice limit. No devices give one empty slice: an empty pool tells the
// scheduler the driver is up and simply has nothing to offer, which differs
// from no pool at all.
func Slices(devices []resourceapi.Device) []resourceslice.Slice {
	if len(devices) == 0 {
		return []resourceslice.Slice{{Devices: []resourceapi.Device{}}}
	}
	limit := SliceLimit(devices)
	var out []resourceslice.Slice
	for start := 0; start < len(devices); start += limit {
		end := min(start+limit, len(devices))
		out = append(out, resourceslice.Slice{Devices: devices[start:end:end]})
	}
	return out
}

// CounterSetSlices puts counter sets, in order, into slices of their own,
// at most [resourceapi.ResourceSliceMaxCounterSets] in each: a slice may
// hold devices or counter sets, not both. Devices in other slices of the
// same pool consume from them.
func CounterSetSlices(sets []resourceapi.CounterSet) []resourceslice.Slice {
	var out []resourceslice.Slice
	for start := 0; start < len(sets); start += resourceapi.ResourceSliceMaxCounterSets {
		end := min(start+resourceapi.ResourceSliceMaxCounterSets, len(sets))
		out = append(out, resourceslice.Slice{SharedCounters: sets[start:end:end]})
	}
	return out
}

// PoolSlices returns the slices of one pool: the counter sets first, then
// the devices chunked by [Slices]. A pool with neither is one empty slice.
func PoolSlices(sets []resourceapi.CounterSet, devices []resourceapi.Device) []resourceslice.Slice {
	out := CounterSetSlices(sets)
	if len(devices) == 0 && len(out) > 0 {
		return out
	}
	return append(out, Slices(devices)...)
}

// Slices returns the slices of the model's pool, see [PoolSlices].
func (m *Model) Slices() []resourceslice.Slice {
	return PoolSlices(m.CounterSets, m.APIDevices())
}

// DriverResources is the one pool, named after the node, that a node's
// kubelet plugin publishes: its counter sets and devices.
func (m *Model) DriverResources(poolName string) resourceslice.DriverResources {
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{
			poolName: {Slices: m.Slices()},
		},
	}
}

// DriverResources is the one pool, named after the node, that a node's
// kubelet plugin publishes, for devices that consume no counters: it has
// no counter sets. Use [Model.DriverResources] for a model built with
// [WithDynamicMIG].
func DriverResources(poolName string, devices []resourceapi.Device) resourceslice.DriverResources {
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{
			poolName: {Slices: PoolSlices(nil, devices)},
		},
	}
}
