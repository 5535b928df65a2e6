package devicemodel_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gpudra/gpudra/deployments/deviceclasses"
	"github.com/gpudra/gpudra/pkg/allocation"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
)

const driverName = "gpu.nvidia.com"

// resourceSlices turns the pools of res into the ResourceSlices the
// resourceslice controller would publish for node.
func resourceSlices(node string, res resourceslice.DriverResources) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for poolName, pool := range res.Pools {
		for i, s := range pool.Slices {
			out = append(out, &resourceapi.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", node, strings.ReplaceAll(driverName, ".", "-"), i)},
				Spec: resourceapi.ResourceSliceSpec{
					Driver:         driverName,
					Pool:           resourceapi.ResourcePool{Name: poolName, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
					NodeName:       &node,
					Devices:        s.Devices,
					SharedCounters: s.SharedCounters,
				},
			})
		}
	}
	return out
}

// allocNode is a randomly made node for the allocation property test:
// its GPUs, the simulated model of each, and its devices.
type allocNode struct {
	name   string
	gpus   []hardware.GPU
	models []string // by GPU index; the simulated model
	model  *devicemodel.Model
	slices []*resourceapi.ResourceSlice
}

// newAllocNode makes a node of one to three GPUs of random models, with
// MIG mode on or off at random where the model has MIG.
func newAllocNode(t *testing.T, rng *rand.Rand) *allocNode {
	t.Helper()
	names := sim.ModelNames()
	n := &allocNode{name: "node-0"}
	for i := range 1 + rng.IntN(3) {
		model := names[rng.IntN(len(names))]
		n.gpus = append(n.gpus, simGPU(t, i, model, rng.IntN(3) > 0))
		n.models = append(n.models, model)
	}
	// Every GPU is also offered for passthrough: the VFIO device must
	// exclude the full GPU and the MIG devices of its GPU like they
	// exclude each other.
	vfio := devicemodel.WithVFIO(devicemodel.VFIOBeside, func(g hardware.GPU) (devicemodel.VFIOInfo, bool) {
		return devicemodel.VFIOInfo{VendorID: "0x10de", DeviceID: "0x2330", IOMMUGroup: 20 + g.Index}, true
	})
	model, err := devicemodel.Build(inventoryOf(n.gpus...), devicemodel.WithDynamicMIG(), vfio)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	n.model = model
	n.slices = resourceSlices(n.name, n.model.DriverResources(n.name))
	return n
}

// unit is one device a claim asks for: a MIG device of a profile, or
// (profile "") a full GPU, or (profile vfioUnit) a GPU for passthrough.
type unit struct{ profile string }

// vfioUnit is the profile of a unit that asks for a VFIO device.
const vfioUnit = "vfio"

// occupancy is what live allocations hold on one GPU, by the simulator's
// profile table: memory slices, instances per profile, the full GPU.
type occupancy struct {
	slices    uint64
	instances map[string]int
	full      bool
}

// occupancies derives, from the allocated devices alone, what each GPU
// holds. It reports devices that overlap or exceed a profile's instances.
func (n *allocNode) occupancies(t *testing.T, devices []string) ([]occupancy, error) {
	t.Helper()
	occ := make([]occupancy, len(n.models))
	for i := range occ {
		occ[i].instances = map[string]int{}
	}
	for _, name := range devices {
		d, ok := n.model.Lookup(name)
		if !ok {
			return nil, fmt.Errorf("allocated device %s is not published", name)
		}
		o := &occ[d.GPU.Index]
		if d.Kind == devicemodel.KindGPU || d.Kind == devicemodel.KindVFIO {
			if o.full || o.slices != 0 {
				return nil, fmt.Errorf("%s: whole GPU (full or VFIO) allocated twice or next to a MIG device", name)
			}
			o.full = true
			o.slices = ^uint64(0)
			continue
		}
		profile, ok := tableProfile(t, n.models[d.GPU.Index], d.Placement.Profile.Name)
		if !ok || !slices.Contains(profile.PlacementStarts, d.Placement.Start) {
			return nil, fmt.Errorf("%s: %s at %d is not in the %s table", name, d.Placement.Profile.Name, d.Placement.Start, n.models[d.GPU.Index])
		}
		mask := rangeMask(d.Placement.Start, profile.PlacementSize)
		if o.slices&mask != 0 {
			return nil, fmt.Errorf("%s overlaps another allocated device on GPU %d (memory slices %08b, taken %08b)", name, d.GPU.Index, mask, o.slices)
		}
		o.slices |= mask
		o.instances[profile.Name]++
		if o.instances[profile.Name] > profile.Instances {
			return nil, fmt.Errorf("%s: %d instances of %s on GPU %d, the table allows %d", name, o.instances[profile.Name], profile.Name, d.GPU.Index, profile.Instances)
		}
	}
	return occ, nil
}

func tableProfile(t *testing.T, model, profile string) (sim.MIGProfile, bool) {
	for _, p := range simModel(t, model).MIGProfiles {
		if p.Name == profile {
			return p, true
		}
	}
	return sim.MIGProfile{}, false
}

func rangeMask(start, size int) uint64 { return (uint64(1)<<size - 1) << start }

// fits reports whether the units fit on the node's free places, by the
// simulator's table alone: a search over every GPU and placement start.
func (n *allocNode) fits(t *testing.T, occ []occupancy, units []unit) bool {
	if len(units) == 0 {
		return true
	}
	u, rest := units[0], units[1:]
	for i, model := range n.models {
		o, migEnabled := &occ[i], n.gpus[i].MIGEnabled
		if u.profile == "" || u.profile == vfioUnit {
			if migEnabled || o.full {
				continue
			}
			o.full = true
			ok := n.fits(t, occ, rest)
			o.full = false
			if ok {
				return true
			}
			continue
		}
		if !migEnabled {
			continue
		}
		p, ok := tableProfile(t, model, u.profile)
		if !ok || o.instances[p.Name] >= p.Instances {
			continue
		}
		for _, start := range p.PlacementStarts {
			mask := rangeMask(start, p.PlacementSize)
			if o.slices&mask != 0 {
				continue
			}
			o.slices |= mask
			o.instances[p.Name]++
			ok := n.fits(t, occ, rest)
			o.slices &^= mask
			o.instances[p.Name]--
			if ok {
				return true
			}
		}
	}
	return false
}

// randomClaim asks for one to three requests of random MIG profiles or
// full GPUs. Profiles are mostly those of the node's GPUs in MIG mode,
// sometimes any simulated model's, which may exist nowhere on the node.
func randomClaim(rng *rand.Rand, seq int, nodeProfiles, allProfiles []string) (*resourceapi.ResourceClaim, []unit) {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", seq), Namespace: "default", UID: types.UID(fmt.Sprintf("uid-%d", seq))},
	}
	var units []unit
	requests := 1
	switch r := rng.IntN(10); {
	case r >= 9:
		requests = 3
	case r >= 6:
		requests = 2
	}
	for i := range requests {
		count := int64(1)
		if rng.IntN(6) == 0 {
			count = 2
		}
		req := resourceapi.ExactDeviceRequest{AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}
		var u unit
		switch r := rng.IntN(8); {
		case r < 2:
			req.DeviceClassName = deviceclasses.GPU
		case r < 3:
			req.DeviceClassName = deviceclasses.VFIO
			u.profile = vfioUnit
		default:
			profiles := nodeProfiles
			if len(profiles) == 0 || rng.IntN(10) == 0 {
				profiles = allProfiles
			}
			u.profile = profiles[rng.IntN(len(profiles))]
			req.DeviceClassName = deviceclasses.MIG
			req.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf(`device.attributes["%s"].profile == %q`, driverName, u.profile),
			}}}
		}
		for range count {
			units = append(units, u)
		}
		claim.Spec.Devices.Requests = append(claim.Spec.Devices.Requests, resourceapi.DeviceRequest{Name: fmt.Sprintf("r%d", i), Exactly: &req})
	}
	return claim, units
}

// TestDynamicMIGAllocation drives the scheduler's own allocator with the
// slices of random dynamic-MIG nodes: random claims for MIG profiles and
// full GPUs, interleaved with releasing earlier claims. Judged by the
// simulator's profile tables, never by the counters: no two live
// allocations overlap on a GPU, and when the allocator finds no fit, none
// exists. Every allocator implementation is run, as the scheduler picks
// one by its enabled features.
func TestDynamicMIGAllocation(t *testing.T) {
	classes, err := deviceclasses.All()
	if err != nil {
		t.Fatal(err)
	}
	seeds, steps := 40, 40
	if testing.Short() {
		seeds = 10
	}
	var profiles []string
	for _, model := range migModels(t) {
		for _, p := range simModel(t, model).MIGProfiles {
			if !slices.Contains(profiles, p.Name) {
				profiles = append(profiles, p.Name)
			}
		}
	}
	celCache := cel.NewCache(100, cel.Features{})
	for _, impl := range []string{"stable", "incubating", "experimental"} {
		t.Run(impl, func(t *testing.T) {
			structured.EnableAllocators(impl)
			t.Cleanup(func() { structured.EnableAllocators() })
			var allocated, noFit, passedThrough int
			for seed := range uint64(seeds) {
				a, n, v := runAllocationSequence(t, seed, steps, allocation.Classes(classes), celCache, profiles)
				allocated, noFit, passedThrough = allocated+a, noFit+n, passedThrough+v
				if t.Failed() {
					t.Fatalf("seed %d failed", seed)
				}
			}
			t.Logf("%d claims allocated (%d VFIO devices among them), %d found no fit", allocated, passedThrough, noFit)
			if passedThrough == 0 {
				t.Error("no VFIO device was ever allocated: the test checks nothing about passthrough")
			}
			// A test that never allocates, or never runs out of room,
			// checks little.
			if allocated < seeds*steps/5 || noFit < seeds*steps/20 {
				t.Errorf("%d allocated and %d without fit of %d claims: the random mix is off", allocated, noFit, seeds*steps)
			}
		})
	}
}

// runAllocationSequence runs one seed's node and claims; it reports how
// many claims were allocated, how many found no fit, and how many VFIO
// devices were allocated.
func runAllocationSequence(t *testing.T, seed uint64, steps int, classes allocation.Classes, celCache *cel.Cache, profiles []string) (allocated, noFit, passedThrough int) {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 0x677075647261))
	n := newAllocNode(t, rng)
	var nodeProfiles []string
	for i, g := range n.gpus {
		for _, p := range simModel(t, n.models[i]).MIGProfiles {
			if g.MIGEnabled && !slices.Contains(nodeProfiles, p.Name) {
				nodeProfiles = append(nodeProfiles, p.Name)
			}
		}
	}
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}
	features := structured.Features{PartitionableDevices: true}
	live := map[string][]string{} // claim -> devices
	var order []string            // live claims, oldest first
	var history []string
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("seed %d, node %v: "+format, append([]any{seed, n.models}, args...)...)
		t.Logf("history:\n%s", strings.Join(history, "\n"))
	}
	for seq := range steps {
		if len(order) > 0 && rng.IntN(10) < 4 {
			i := rng.IntN(len(order))
			history = append(history, fmt.Sprintf("release %s %v", order[i], live[order[i]]))
			delete(live, order[i])
			order = slices.Delete(order, i, i+1)
			continue
		}
		var held []string
		state := allocation.NewState()
		for _, c := range order {
			for _, d := range live[c] {
				held = append(held, d)
				state.AllocatedDevices.Insert(structured.MakeDeviceID(driverName, n.name, d))
			}
		}
		occ, err := n.occupancies(t, held)
		if err != nil {
			fail("%v", err)
			return
		}
		claim, units := randomClaim(rng, seq, nodeProfiles, profiles)
		allocator, err := structured.NewAllocator(ctx, features, state, classes, n.slices, celCache)
		if err != nil {
			t.Fatalf("NewAllocator: %v", err)
		}
		results, err := allocator.Allocate(ctx, node, []*resourceapi.ResourceClaim{claim})
		if err != nil {
			fail("Allocate %s: %v", claim.Name, err)
			return
		}
		if results == nil {
			noFit++
			history = append(history, fmt.Sprintf("%s %v: no fit", claim.Name, units))
			if n.fits(t, occ, units) {
				fail("%s %v: the allocator found no fit, but the table has free places", claim.Name, units)
				return
			}
			continue
		}
		allocated++
		var got []string
		for _, r := range results[0].Devices.Results {
			if r.Driver != driverName || r.Pool != n.name {
				fail("%s: device %s from driver %s, pool %s", claim.Name, r.Device, r.Driver, r.Pool)
			}
			d, ok := n.model.Lookup(r.Device)
			if !ok {
				fail("%s: allocated device %s is not published", claim.Name, r.Device)
				return
			}
			req := claim.Spec.Devices.Requests[slices.IndexFunc(claim.Spec.Devices.Requests, func(q resourceapi.DeviceRequest) bool { return q.Name == r.Request })]
			switch {
			case req.Exactly.DeviceClassName == deviceclasses.GPU && d.Kind != devicemodel.KindGPU,
				req.Exactly.DeviceClassName == deviceclasses.VFIO && d.Kind != devicemodel.KindVFIO,
				req.Exactly.DeviceClassName == deviceclasses.MIG && (d.Kind != devicemodel.KindMIG || !strings.Contains(req.Exactly.Selectors[0].CEL.Expression, fmt.Sprintf("%q", d.Placement.Profile.Name))):
				fail("%s: request %s got %s", claim.Name, r.Request, r.Device)
			}
			if d.Kind == devicemodel.KindVFIO {
				passedThrough++
			}
			got = append(got, r.Device)
		}
		if len(got) != len(units) {
			fail("%s: %d devices for %d asked", claim.Name, len(got), len(units))
		}
		history = append(history, fmt.Sprintf("%s %v: %v", claim.Name, units, got))
		if _, err := n.occupancies(t, append(held, got...)); err != nil {
			fail("after %s: %v", claim.Name, err)
			return
		}
		live[claim.Name] = got
		order = append(order, claim.Name)
	}
	return allocated, noFit, passedThrough
}
