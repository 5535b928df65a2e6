package devicemodel

import (
	"fmt"
	"maps"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// Counter names of a MIG-capable GPU's counter set (see [WithDynamicMIG]).
// The API wants DNS labels here, so they are spelled differently from the
// capacities of the same meaning.
const (
	CounterMemory          = "memory"
	CounterMultiprocessors = "multiprocessors"
	CounterCopyEngines     = "copy-engines"
	CounterDecoders        = "decoders"
	CounterEncoders        = "encoders"
	CounterJPEGEngines     = "jpeg-engines"
	CounterOFAEngines      = "ofa-engines"
)

// CounterSetName is the name of the counter set of the GPU with the given
// minor number.
func CounterSetName(minor int) string { return fmt.Sprintf("gpu-%d-counters", minor) }

// MemorySliceCounter is the name of the counter of one MIG memory slice;
// its total is 1, so that two devices on one memory slice exclude each
// other.
func MemorySliceCounter(slice int) string { return fmt.Sprintf("memory-slice-%d", slice) }

// engineCounters are the counters other than memory slices, in the order
// of [migResources].
const engineCounters = 7

// isDynamicMIGCapable reports whether gpu can be published with dynamic
// MIG: discovery found its profiles, memory slices and memory (which its
// counter set holds).
func isDynamicMIGCapable(gpu *hardware.GPU) bool {
	return len(gpu.MIGProfiles) > 0 && gpu.MIGMemorySlices > 0 && gpu.MemoryBytes > 0
}

// addDynamicMIGGPU publishes gpu's counter set, and either its full GPU
// (MIG mode off) or one MIG device per profile and placement (MIG mode
// on), or, when its mode may be switched, both. The MIG devices foreign
// says are not gpudra's (see [WithForeignMIGDevices]) are published as
// they are instead, and take what they occupy out of the counter set.
func (m *Model) addDynamicMIGGPU(gpu hardware.GPU, gpuAttrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, switchable bool,
	foreign func(*hardware.GPU, *hardware.MIGDevice) bool) error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("GPU %d (%s): dynamic MIG: "+format, append([]any{gpu.Index, gpu.UUID}, args...)...)
	}
	if n := engineCounters + gpu.MIGMemorySlices; n > resourceapi.ResourceSliceMaxCountersPerCounterSet {
		return fail("%d memory slices need %d counters, more than the %d a counter set may have",
			gpu.MIGMemorySlices, n, resourceapi.ResourceSliceMaxCountersPerCounterSet)
	}
	for i := range gpu.MIGProfiles {
		if err := checkProfile(&gpu.MIGProfiles[i], gpu.MIGMemorySlices); err != nil {
			return fail("%w", err)
		}
	}
	whole, ok := wholeGPUProfile(&gpu)
	if !ok {
		return fail("no MIG profile spans all %d memory slices, so the GPU's engine totals are unknown", gpu.MIGMemorySlices)
	}
	var others []hardware.MIGDevice
	for i := range gpu.MIGDevices {
		if foreign != nil && foreign(&gpu, &gpu.MIGDevices[i]) {
			others = append(others, gpu.MIGDevices[i])
		}
	}
	total := profileResources(whole)
	total.memoryBytes = gpu.MemoryBytes // a little more than the whole-GPU instance has
	set := resourceapi.CounterSet{
		Name:     CounterSetName(gpu.Minor),
		Counters: counters(total.less(others), 0, gpu.MIGMemorySlices, true),
	}
	for i := range others {
		for s := others[i].PlacementStart; s < others[i].PlacementStart+others[i].PlacementSize; s++ {
			if _, ok := set.Counters[MemorySliceCounter(s)]; ok {
				set.Counters[MemorySliceCounter(s)] = resourceapi.Counter{Value: *resource.NewQuantity(0, resource.DecimalSI)}
			}
		}
	}
	for _, existing := range m.CounterSets {
		if existing.Name == set.Name {
			return fail("counter set name %q is not unique", set.Name)
		}
	}
	m.CounterSets = append(m.CounterSets, set)

	// A GPU holding foreign MIG devices is never offered whole: switching
	// MIG mode off would destroy them.
	if (!gpu.MIGEnabled || switchable) && len(others) == 0 {
		api := fullGPUDevice(&gpu, gpuAttrs)
		api.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: set.Name, Counters: nonZero(set.Counters)}}
		if err := m.add(Device{Kind: KindGPU, API: api, GPU: gpu}); err != nil || !switchable {
			return err
		}
	}
	if !gpu.MIGEnabled && !switchable {
		return nil
	}
	for _, mig := range others {
		if err := m.addStaticMIGDevice(&gpu, mig, gpuAttrs); err != nil {
			return err
		}
	}

	// gpudra's existing MIG devices are the placements they occupy:
	// Prepare uses them as they are.
	type place struct{ profileID, start int }
	existing := make(map[place]int, len(gpu.MIGDevices))
	for i, mig := range gpu.MIGDevices {
		if !slices.ContainsFunc(others, func(o hardware.MIGDevice) bool { return o.UUID == mig.UUID }) {
			existing[place{mig.ProfileID, mig.PlacementStart}] = i
		}
	}
	for _, profile := range gpu.MIGProfiles {
		r := profileResources(&profile)
		// Highest start first: the scheduler takes the first device that
		// fits, so small instances fill a GPU from the top and leave the
		// low starts, the only ones 4g and 7g instances have, free longest.
		for _, start := range slices.Backward(profile.PlacementStarts) {
			if slices.ContainsFunc(others, func(o hardware.MIGDevice) bool {
				return start < o.PlacementStart+o.PlacementSize && o.PlacementStart < start+profile.PlacementSize
			}) {
				continue
			}
			api := resourceapi.Device{
				Name: MIGName(gpu.Minor, profile.Name, profile.ProfileID, start),
				// No uuid: a MIG device has none before it is created, and
				// publishing it only while one exists would rewrite the
				// slices on every creation.
				Attributes: migAttributes(&gpu, profile.Name, gpuAttrs),
				Capacity:   migCapacity(r, start, profile.PlacementSize),
				ConsumesCounters: []resourceapi.DeviceCounterConsumption{{
					CounterSet: set.Name,
					Counters:   counters(r, start, profile.PlacementSize, false),
				}},
			}
			d := Device{Kind: KindMIG, API: api, GPU: gpu, Placement: &Placement{Profile: profile, Start: start}}
			if i, ok := existing[place{profile.ProfileID, start}]; ok {
				mig := gpu.MIGDevices[i]
				d.MIG = &mig
				delete(existing, place{profile.ProfileID, start})
			}
			if err := m.add(d); err != nil {
				return err
			}
		}
	}
	for _, mig := range gpu.MIGDevices {
		if _, unplaced := existing[place{mig.ProfileID, mig.PlacementStart}]; !unplaced {
			continue
		}
		return fail("MIG device %s (%s, profile ID %d at %d) is at no placement of the GPU's profiles", mig.UUID, mig.Profile, mig.ProfileID, mig.PlacementStart)
	}
	return nil
}

// checkProfile makes sure every placement of p lies on the GPU's memory
// slices, so that its memory-slice counters exist.
func checkProfile(p *hardware.MIGProfile, memorySlices int) error {
	if p.PlacementSize <= 0 || p.PlacementSize > memorySlices {
		return fmt.Errorf("profile %s: placement size %d is not within 1..%d memory slices", p.Name, p.PlacementSize, memorySlices)
	}
	for _, start := range p.PlacementStarts {
		if start < 0 || start+p.PlacementSize > memorySlices {
			return fmt.Errorf("profile %s: placement %d..%d is not within the %d memory slices", p.Name, start, start+p.PlacementSize-1, memorySlices)
		}
	}
	return nil
}

// wholeGPUProfile returns the profile with the most compute slices among
// those spanning all memory slices (7g on A100, H100, H200): its engines
// are the GPU's in MIG mode.
func wholeGPUProfile(gpu *hardware.GPU) (*hardware.MIGProfile, bool) {
	var whole *hardware.MIGProfile
	for i := range gpu.MIGProfiles {
		p := &gpu.MIGProfiles[i]
		if p.PlacementSize == gpu.MIGMemorySlices && (whole == nil || p.Slices > whole.Slices) {
			whole = p
		}
	}
	return whole, whole != nil
}

// profileResources are the memory and engines of one instance of p.
func profileResources(p *hardware.MIGProfile) migResources {
	return migResources{p.MemoryBytes, p.Multiprocessors, p.CopyEngines, p.Decoders, p.Encoders, p.JPEGEngines, p.OFAEngines}
}

// less is r less what the MIG devices ms occupy, never below zero.
func (r migResources) less(ms []hardware.MIGDevice) migResources {
	sub := func(n, m int) int { return max(n-m, 0) }
	for i := range ms {
		o := deviceResources(&ms[i])
		if o.memoryBytes > r.memoryBytes {
			r.memoryBytes = 0
		} else {
			r.memoryBytes -= o.memoryBytes
		}
		r.multiprocessors = sub(r.multiprocessors, o.multiprocessors)
		r.copyEngines = sub(r.copyEngines, o.copyEngines)
		r.decoders = sub(r.decoders, o.decoders)
		r.encoders = sub(r.encoders, o.encoders)
		r.jpegEngines = sub(r.jpegEngines, o.jpegEngines)
		r.ofaEngines = sub(r.ofaEngines, o.ofaEngines)
	}
	return r
}

// counters are the counters of r and of the memory slices start to
// start+size-1. Counters of zero are left out unless keepZero: a counter
// set lists every counter of the GPU, a consumption only what it takes.
func counters(r migResources, start, size int, keepZero bool) map[string]resourceapi.Counter {
	c := make(map[string]resourceapi.Counter, engineCounters+size)
	put := func(name string, n int64, format resource.Format) {
		if n != 0 || keepZero {
			c[name] = resourceapi.Counter{Value: *resource.NewQuantity(n, format)}
		}
	}
	put(CounterMemory, int64(r.memoryBytes), resource.BinarySI)
	put(CounterMultiprocessors, int64(r.multiprocessors), resource.DecimalSI)
	put(CounterCopyEngines, int64(r.copyEngines), resource.DecimalSI)
	put(CounterDecoders, int64(r.decoders), resource.DecimalSI)
	put(CounterEncoders, int64(r.encoders), resource.DecimalSI)
	put(CounterJPEGEngines, int64(r.jpegEngines), resource.DecimalSI)
	put(CounterOFAEngines, int64(r.ofaEngines), resource.DecimalSI)
	for i := start; i < start+size; i++ {
		put(MemorySliceCounter(i), 1, resource.DecimalSI)
	}
	return c
}

// nonZero returns the counters of c that are not zero, in a new map.
func nonZero(c map[string]resourceapi.Counter) map[string]resourceapi.Counter {
	out := maps.Clone(c)
	maps.DeleteFunc(out, func(_ string, v resourceapi.Counter) bool { return v.Value.IsZero() })
	return out
}
