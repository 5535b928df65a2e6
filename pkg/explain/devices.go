package explain

import (
	"fmt"
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/allocation"
)

// deviceState is whether a device can be given to one more claim,
// regardless of what the claim asks.
type deviceState int

const (
	stateFree deviceState = iota
	// stateShared: held by other claims but allows multiple allocations;
	// what capacity is left decides.
	stateShared
	stateInUse
	// stateCountersUsedUp: free itself, but devices allocated from the
	// same shared counters (a MIG device of the GPU, the GPU itself) leave
	// too little for it.
	stateCountersUsedUp
)

func (s deviceState) String() string {
	switch s {
	case stateFree:
		return "free"
	case stateShared:
		return "shared, in use"
	case stateInUse:
		return "in use"
	case stateCountersUsedUp:
		return "blocked by shared counters"
	}
	return fmt.Sprintf("state %d", int(s))
}

// device is one device the allocator can see, with what the explanation
// needs to know of it.
type device struct {
	id  structured.DeviceID
	api *resourceapi.Device
	// node is the node of a node-local device; where is that node, or
	// the device's pool for others.
	node, where string
	// nodes are the candidate nodes that can use it.
	nodes sets.Set[string]
	state deviceState
	// holder is the claim holding the device (in use or shared), or the
	// device and claim holding the counters it needs.
	holder string
	// consumed is the capacity other claims hold of a shared device.
	consumed map[resourceapi.QualifiedName]resource.Quantity
}

func (d *device) label() string { return d.where + "/" + d.api.Name }

// inventory is every device of the complete pools.
type inventory struct {
	devices  []*device
	warnings []string
}

// poolKey identifies a resource pool.
type poolKey struct{ driver, pool string }

// newInventory collects the devices of the slices as the allocator
// gathers pools: the newest generation of each pool, incomplete pools left
// out. Every device's state says whether other claims leave it free.
// nodes are the candidate nodes; allocated is what other claims hold and
// owners names the claim holding each device.
func newInventory(allSlices []*resourceapi.ResourceSlice, nodes []*corev1.Node, allocated structured.AllocatedState, owners map[structured.DeviceID]string) (*inventory, error) {
	newest := map[poolKey]int64{}
	for _, s := range allSlices {
		k := poolKey{s.Spec.Driver, s.Spec.Pool.Name}
		newest[k] = max(newest[k], s.Spec.Pool.Generation)
	}
	pools := map[poolKey][]*resourceapi.ResourceSlice{}
	for _, s := range allSlices {
		k := poolKey{s.Spec.Driver, s.Spec.Pool.Name}
		if s.Spec.Pool.Generation == newest[k] {
			pools[k] = append(pools[k], s)
		}
	}
	inv := &inventory{}
	keys := slices.SortedFunc(maps.Keys(pools), func(a, b poolKey) int {
		if a.driver != b.driver {
			return compareStrings(a.driver, b.driver)
		}
		return compareStrings(a.pool, b.pool)
	})
	for _, k := range keys {
		poolSlices := pools[k]
		slices.SortFunc(poolSlices, func(a, b *resourceapi.ResourceSlice) int { return compareStrings(a.Name, b.Name) })
		if want := poolSlices[0].Spec.Pool.ResourceSliceCount; int64(len(poolSlices)) < want {
			inv.warnings = append(inv.warnings, fmt.Sprintf("pool %s of driver %s is incomplete (%d of %d ResourceSlices of generation %d): the scheduler does not allocate from it until it is complete", k.pool, k.driver, len(poolSlices), want, newest[k]))
			continue
		}
		if err := inv.addPool(k, poolSlices, nodes, allocated, owners); err != nil {
			return nil, err
		}
	}
	return inv, nil
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// addPool adds the devices of one complete pool.
func (inv *inventory) addPool(k poolKey, poolSlices []*resourceapi.ResourceSlice, nodes []*corev1.Node, allocated structured.AllocatedState, owners map[structured.DeviceID]string) error {
	// What of each shared counter is left after the allocated devices,
	// and which allocated device took from each counter set.
	left := map[string]map[string]resource.Quantity{}
	for _, s := range poolSlices {
		for _, cs := range s.Spec.SharedCounters {
			set := map[string]resource.Quantity{}
			for name, c := range cs.Counters {
				set[name] = c.Value.DeepCopy()
			}
			left[cs.Name] = set
		}
	}
	takenBy := map[string]string{}
	for _, s := range poolSlices {
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			id := structured.MakeDeviceID(k.driver, k.pool, d.Name)
			if !structured.IsDeviceAllocated(id, &allocated) {
				continue
			}
			for _, cc := range d.ConsumesCounters {
				for name, c := range cc.Counters {
					if q, ok := left[cc.CounterSet][name]; ok {
						q.Sub(c.Value)
						left[cc.CounterSet][name] = q
					}
				}
				if _, ok := takenBy[cc.CounterSet]; !ok {
					takenBy[cc.CounterSet] = fmt.Sprintf("%s of claim %s", d.Name, owners[id])
				}
			}
		}
	}

	for _, s := range poolSlices {
		sliceNodes, err := reach(nodes, s.Spec.NodeName, s.Spec.AllNodes, s.Spec.NodeSelector)
		if err != nil {
			return fmt.Errorf("ResourceSlice %s: %w", s.Name, err)
		}
		for i := range s.Spec.Devices {
			api := &s.Spec.Devices[i]
			d := &device{id: structured.MakeDeviceID(k.driver, k.pool, api.Name), api: api, nodes: sliceNodes, where: k.pool}
			d.node = ptr.Deref(s.Spec.NodeName, ptr.Deref(api.NodeName, ""))
			if d.node != "" {
				d.where = d.node
			}
			if ptr.Deref(s.Spec.PerDeviceNodeSelection, false) {
				if d.nodes, err = reach(nodes, api.NodeName, api.AllNodes, api.NodeSelector); err != nil {
					return fmt.Errorf("ResourceSlice %s, device %s: %w", s.Name, api.Name, err)
				}
			}
			d.state, d.holder = state(d, allocated, owners, left, takenBy)
			if d.state == stateShared {
				d.consumed = map[resourceapi.QualifiedName]resource.Quantity{}
				for name, q := range allocated.AggregatedCapacity[d.id] {
					d.consumed[name] = q.DeepCopy()
				}
			}
			inv.devices = append(inv.devices, d)
		}
	}
	return nil
}

// state says whether other claims leave the device free, as the
// allocator decides it: held devices are in use unless they allow
// multiple allocations; a free device whose counters the held ones used
// up cannot be had either.
func state(d *device, allocated structured.AllocatedState, owners map[structured.DeviceID]string, left map[string]map[string]resource.Quantity, takenBy map[string]string) (deviceState, string) {
	shared := ptr.Deref(d.api.AllowMultipleAllocations, false)
	if allocated.AllocatedDevices.Has(d.id) {
		return stateInUse, owners[d.id]
	}
	if shared && structured.IsDeviceAllocated(d.id, &allocated) {
		// Its counters are charged once, already.
		return stateShared, owners[d.id]
	}
	for _, cc := range d.api.ConsumesCounters {
		for name, c := range cc.Counters {
			if q, ok := left[cc.CounterSet][name]; ok && q.Cmp(c.Value) < 0 {
				return stateCountersUsedUp, takenBy[cc.CounterSet]
			}
		}
	}
	return stateFree, ""
}

// reach returns the candidate nodes that can use devices with this node
// selection.
func reach(nodes []*corev1.Node, nodeName *string, allNodes *bool, selector *corev1.NodeSelector) (sets.Set[string], error) {
	out := sets.New[string]()
	for _, n := range nodes {
		ok, err := structured.NodeMatches(allocation.Features, n, ptr.Deref(nodeName, ""), ptr.Deref(allNodes, false), selector)
		if err != nil {
			return nil, err
		}
		if ok {
			out.Insert(n.Name)
		}
	}
	return out, nil
}
