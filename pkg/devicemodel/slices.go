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

// DriverResources is the one pool, named after the node, that a node's
// kubelet plugin publishes.
func DriverResources(poolName string, devices []resourceapi.Device) resourceslice.DriverResources {
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{
			poolName: {Slices: Slices(devices)},
		},
	}
}
