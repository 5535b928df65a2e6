package deviceplugin

import (
	"cmp"
	"fmt"
	"slices"
)

// distance says how far apart two devices are for a workload that spans
// them: 0 on one GPU (MIG devices or replicas of it), 1 under one PCIe
// root (a PCIe switch: peer-to-peer without the CPU), 2 on one NUMA
// node, 3 across NUMA nodes. NVLink is not modelled: on the NVSwitch
// systems gpudra knows (DGX/HGX A100, H100, H200, B200) every pair of GPUs
// has the same NVLink bandwidth, so PCIe locality is what tells pairs
// apart, as in NVIDIA's allocator on those systems.
func distance(a, b *Device) int {
	ga, gb := a.Device.GPU, b.Device.GPU
	switch {
	case ga.UUID == gb.UUID:
		return 0
	case ga.PCIeRoot != "" && ga.PCIeRoot == gb.PCIeRoot:
		return 1
	case ga.NUMANode != nil && gb.NUMANode != nil && *ga.NUMANode == *gb.NUMANode:
		return 2
	}
	return 3
}

// Preferred picks size devices of r from available, with mustInclude
// among them. Whole devices are packed close together (smallest sum of
// pairwise distances, greedily from each possible first device); replicas
// are spread over the GPUs with the most free replicas, so that time
// slices land on idle GPUs first. The result is deterministic.
func (r *Resource) Preferred(available, mustInclude []string, size int) ([]string, error) {
	byID := map[string]*Device{}
	for i := range r.Devices {
		byID[r.Devices[i].ID] = &r.Devices[i]
	}
	var avail []*Device
	for _, id := range available {
		d, ok := byID[id]
		if !ok {
			return nil, fmt.Errorf("available device %q is not a device of %s", id, r.Name)
		}
		avail = append(avail, d)
	}
	slices.SortFunc(avail, func(a, b *Device) int { return cmp.Compare(a.ID, b.ID) })
	picked := []*Device{}
	for _, id := range mustInclude {
		d, ok := byID[id]
		if !ok {
			return nil, fmt.Errorf("must-include device %q is not a device of %s", id, r.Name)
		}
		if !slices.Contains(picked, d) {
			picked = append(picked, d)
		}
	}
	if size > len(avail) || size < len(picked) {
		return nil, fmt.Errorf("cannot pick %d of %d available %s devices with %d that must be included", size, len(avail), r.Name, len(picked))
	}
	var out []*Device
	if r.Replicas > 0 {
		out = spread(avail, picked, size)
	} else {
		out = pack(avail, picked, size)
	}
	ids := make([]string, len(out))
	for i, d := range out {
		ids[i] = d.ID
	}
	return ids, nil
}

// pack grows picked to size devices, each time adding the available
// device closest to those picked; without mustInclude it tries every
// first device and keeps the tightest set.
func pack(avail, picked []*Device, size int) []*Device {
	grow := func(set []*Device) ([]*Device, int) {
		set = slices.Clone(set)
		for len(set) < size {
			var best *Device
			bestCost := 0
			for _, d := range avail {
				if slices.Contains(set, d) {
					continue
				}
				c := 0
				for _, p := range set {
					c += distance(d, p)
				}
				if best == nil || c < bestCost {
					best, bestCost = d, c
				}
			}
			set = append(set, best)
		}
		return set, cost(set)
	}
	if len(picked) > 0 || size == 0 {
		set, _ := grow(picked)
		return set
	}
	var best []*Device
	bestCost := 0
	for _, first := range avail {
		set, c := grow([]*Device{first})
		if best == nil || c < bestCost {
			best, bestCost = set, c
		}
	}
	return best
}

func cost(set []*Device) int {
	c := 0
	for i := range set {
		for j := i + 1; j < len(set); j++ {
			c += distance(set[i], set[j])
		}
	}
	return c
}

// spread grows picked to size replicas, each time taking a replica of the
// GPU (or MIG device) with the most available replicas left and the
// fewest picked.
func spread(avail, picked []*Device, size int) []*Device {
	set := slices.Clone(picked)
	for len(set) < size {
		left := map[string]int{}
		used := map[string]int{}
		for _, d := range avail {
			if !slices.Contains(set, d) {
				left[d.Device.Name()]++
			}
		}
		for _, d := range set {
			used[d.Device.Name()]++
		}
		var best *Device
		for _, d := range avail {
			if slices.Contains(set, d) {
				continue
			}
			if best == nil {
				best = d
				continue
			}
			n, bn := d.Device.Name(), best.Device.Name()
			if used[n] < used[bn] || (used[n] == used[bn] && left[n] > left[bn]) {
				best = d
			}
		}
		set = append(set, best)
	}
	return set
}
