package devicemodel_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
)

// TestSharingAllocationProperty drives the scheduler's allocator with
// random nodes (models, MIG modes, mode switching, VFIO beside, a random
// sharing mode) and random claims for shares, MIG devices and VFIO
// devices, interleaved with releases. Judged by the hardware and the
// sharing rules, not by the published counters: no GPU ever holds a share
// next to a MIG or VFIO device, shares never add up to more than their
// GPU (in capacity and in the limits their MPS daemons get), and when a
// share claim finds no room, no shared GPU had room for it.
func TestSharingAllocationProperty(t *testing.T) {
	seeds, steps := uint64(30), 40
	if testing.Short() {
		seeds = 8
	}
	forEachAllocator(t, func(t *testing.T, features structured.Features) {
		var allocated, noFit, shares int
		for seed := range seeds {
			a, n, s := runSharingSequence(t, features, seed, steps)
			allocated, noFit, shares = allocated+a, noFit+n, shares+s
			if t.Failed() {
				t.Fatalf("seed %d failed", seed)
			}
		}
		t.Logf("%d claims allocated (%d shares), %d found no room", allocated, shares, noFit)
		if shares < int(seeds)*steps/5 || noFit < int(seeds)*steps/20 {
			t.Errorf("%d shares allocated and %d claims without room: the random mix checks little", shares, noFit)
		}
	})
}

// randomSharingNode is one to three GPUs of random models and MIG modes,
// all offered for passthrough beside, with dynamic MIG, mode switching
// half the time, and a random sharing mode.
func randomSharingNode(t *testing.T, features structured.Features, rng *rand.Rand) (*shareNode, string) {
	models := sim.ModelNames()
	var gpus []hardware.GPU
	for i := range 1 + rng.IntN(3) {
		gpus = append(gpus, simGPU(t, i, models[rng.IntN(len(models))], rng.IntN(2) == 0))
	}
	mode := sharingModes[rng.IntN(len(sharingModes))]
	if mode.Mode == devicemodel.SharingShares {
		mode.Shares = 1 + rng.IntN(8)
	}
	mode.ShareByDefault = rng.IntN(2) == 0
	opts := []devicemodel.Option{devicemodel.WithDynamicMIG(), vfioFor(devicemodel.VFIOBeside), devicemodel.WithSharing(mode)}
	switching := rng.IntN(2) == 0
	if switching {
		opts = append(opts, switchAll)
	}
	var desc []string
	for _, g := range gpus {
		desc = append(desc, fmt.Sprintf("%s(mig %v)", g.ProductName, g.MIGEnabled))
	}
	return newShareNode(t, features, inventoryOf(gpus...), opts...), fmt.Sprintf("%v, switching %v, sharing %s, share by default %v", desc, switching, mode, mode.ShareByDefault)
}

// randomShareRequests are capacity requests a claim for a share might
// make on a node sharing as s: mostly what s offers, sometimes what
// another mode offers.
func randomShareRequests(rng *rand.Rand, s devicemodel.Sharing, memory int64) []string {
	var reqs []string
	if rng.IntN(8) == 0 {
		return []string{[]string{"shares: 1", "memory: 1Gi", "compute: 10"}[rng.IntN(3)]}
	}
	switch s.Mode {
	case devicemodel.SharingMemoryCompute:
		if rng.IntN(5) > 0 {
			reqs = append(reqs, fmt.Sprintf("memory: %q", fmt.Sprint(memory/int64(1+rng.IntN(6)))))
		}
		if rng.IntN(2) == 0 {
			reqs = append(reqs, fmt.Sprintf("compute: %d", 10*rng.IntN(11)))
		}
	case devicemodel.SharingShares:
		if rng.IntN(3) == 0 {
			reqs = append(reqs, fmt.Sprintf("shares: %d", 1+rng.IntN(s.Shares+1)))
		}
	case devicemodel.SharingUnlimited:
		if rng.IntN(3) == 0 {
			reqs = append(reqs, fmt.Sprintf("memory: %q", fmt.Sprint(memory/int64(1+rng.IntN(3)))))
		}
	}
	return reqs
}

// wouldConsume is what a share asking for reqs takes of a device sharing
// as s, by the rules docs/guides/sharing.md states; false when the request is
// outside them.
func wouldConsume(s devicemodel.Sharing, total int64, reqs []string) (map[resourceapi.QualifiedName]int64, bool) {
	asked := map[resourceapi.QualifiedName]int64{}
	for _, r := range reqs {
		name, v, _ := strings.Cut(r, ": ")
		q := resource.MustParse(strings.Trim(v, `"`))
		asked[resourceapi.QualifiedName(name)] = q.Value()
	}
	take := func(name resourceapi.QualifiedName, def, lo, hi int64) (int64, bool) {
		v, ok := asked[name]
		delete(asked, name)
		if !ok {
			return def, true
		}
		v = max(v, lo)
		return v, v <= hi
	}
	out := map[resourceapi.QualifiedName]int64{}
	var okMem, okOther bool
	switch s.Mode {
	case devicemodel.SharingMemoryCompute:
		out[devicemodel.CapMemory], okMem = take(devicemodel.CapMemory, total, 1<<20, total)
		out[devicemodel.CapCompute], okOther = take(devicemodel.CapCompute, 0, 0, 100)
	case devicemodel.SharingShares:
		// A claim that asks for nothing takes the whole GPU, or one share.
		def := int64(s.Shares)
		if s.ShareByDefault {
			def = 1
		}
		out[devicemodel.CapMemory], okMem = take(devicemodel.CapMemory, 0, 0, 0)
		out[devicemodel.CapShares], okOther = take(devicemodel.CapShares, def, 1, int64(s.Shares))
	case devicemodel.SharingUnlimited:
		def := total
		if s.ShareByDefault {
			def = 0
		}
		out[devicemodel.CapMemory], okMem = take(devicemodel.CapMemory, def, 0, total)
		okOther = true
	}
	return out, okMem && okOther && len(asked) == 0
}

// gpuHolds is what live allocations hold of one GPU.
type gpuHolds struct {
	shares   int
	migMask  uint64
	vfio     bool
	consumed map[resourceapi.QualifiedName]int64
	limits   devicemodel.ShareLimits // sums over shares
}

// holds derives, from the live allocations alone, what each GPU holds,
// and reports what breaks the rules.
func (n *shareNode) holds() ([]gpuHolds, error) {
	gpus := 0
	for i := range n.model.Devices {
		gpus = max(gpus, n.model.Devices[i].GPU.Index+1)
	}
	out := make([]gpuHolds, gpus) // by GPU index
	for i := range out {
		out[i].consumed = map[resourceapi.QualifiedName]int64{}
	}
	for _, claim := range slices.Sorted(maps.Keys(n.live)) {
		for _, r := range n.live[claim].Devices.Results {
			d, ok := n.model.Lookup(r.Device)
			if !ok {
				return nil, fmt.Errorf("%s: device %s is not published", claim, r.Device)
			}
			h := &out[d.GPU.Index]
			switch {
			case d.Sharing.Enabled():
				if r.ShareID == nil {
					return nil, fmt.Errorf("%s: shared device %s allocated without a share ID", claim, r.Device)
				}
				limits, err := d.ShareLimits(r.ConsumedCapacity)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", claim, err)
				}
				h.shares++
				h.limits.PinnedMemoryBytes += limits.PinnedMemoryBytes
				h.limits.ActiveThreadPercentage += limits.ActiveThreadPercentage
				for name, q := range r.ConsumedCapacity {
					h.consumed[name] += q.Value()
				}
			case d.Kind == devicemodel.KindVFIO:
				h.vfio = true
			case d.Kind == devicemodel.KindMIG:
				mask := rangeMask(d.Placement.Start, d.Placement.Profile.PlacementSize)
				if h.migMask&mask != 0 {
					return nil, fmt.Errorf("%s: MIG device %s overlaps another", claim, r.Device)
				}
				h.migMask |= mask
			default:
				return nil, fmt.Errorf("%s: unshared full GPU %s on a sharing node", claim, r.Device)
			}
			if h.shares > 0 && (h.vfio || h.migMask != 0) {
				return nil, fmt.Errorf("%s: GPU %d holds %d shares beside a MIG or VFIO device", claim, d.GPU.Index, h.shares)
			}
			if h.vfio && h.migMask != 0 {
				return nil, fmt.Errorf("%s: GPU %d holds a VFIO and a MIG device", claim, d.GPU.Index)
			}
		}
	}
	for i := range n.model.Devices {
		d := &n.model.Devices[i]
		if !d.Sharing.Enabled() {
			continue
		}
		h := out[d.GPU.Index]
		for name, c := range d.API.Capacity {
			if h.consumed[name] > c.Value.Value() {
				return nil, fmt.Errorf("%s: shares consume %d of %s, more than the %s there is", d.Name(), h.consumed[name], name, c.Value.String())
			}
		}
		if d.Sharing.Mode == devicemodel.SharingShares && (h.limits.PinnedMemoryBytes > int64(d.GPU.MemoryBytes) || h.limits.ActiveThreadPercentage > 100) {
			return nil, fmt.Errorf("%s: the limits of its shares add up to %+v, more than the GPU", d.Name(), h.limits)
		}
	}
	return out, nil
}

// runSharingSequence runs one seed's node and claims; it reports how many
// claims were allocated, how many found no room, and how many shares were
// allocated.
func runSharingSequence(t *testing.T, features structured.Features, seed uint64, steps int) (allocated, noFit, shares int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 0x7368617265))
	n, desc := randomSharingNode(t, features, rng)
	var profiles []string
	for i := range n.model.Devices {
		if d := &n.model.Devices[i]; d.Kind == devicemodel.KindMIG && !slices.Contains(profiles, d.Placement.Profile.Name) {
			profiles = append(profiles, d.Placement.Profile.Name)
		}
	}
	var history []string
	fail := func(format string, args ...any) {
		t.Helper()
		t.Errorf("seed %d, node %s: "+format, append([]any{seed, desc}, args...)...)
		t.Logf("history:\n%s", strings.Join(history, "\n"))
	}
	var order []string
	for range steps {
		if len(order) > 0 && rng.IntN(10) < 3 {
			i := rng.IntN(len(order))
			history = append(history, "release "+order[i])
			n.release(order[i])
			order = slices.Delete(order, i, i+1)
			continue
		}
		held, err := n.holds()
		if err != nil {
			fail("%v", err)
			return
		}
		var template, what string
		var reqs []string
		switch r := rng.IntN(10); {
		case r < 2 && len(profiles) > 0:
			what = profiles[rng.IntN(len(profiles))]
			template = migTemplate(what)
		case r < 3:
			what, template = "vfio", vfioTemplate
		default:
			reqs = randomShareRequests(rng, n.sharing(), int64(n.model.Devices[0].GPU.MemoryBytes))
			what, template = fmt.Sprintf("share %v", reqs), gpuTemplate(reqs...)
		}
		claim := n.claim(template)
		res := n.allocate(claim)
		if res == nil {
			noFit++
			history = append(history, fmt.Sprintf("%s %s: no room", claim.Name, what))
			if strings.HasPrefix(what, "share") {
				if dev := n.roomFor(held, reqs); dev != "" {
					fail("%s %s: no room found, but %s had room", claim.Name, what, dev)
					return
				}
			}
			continue
		}
		allocated++
		got := res.Devices.Results[0].Device
		history = append(history, fmt.Sprintf("%s %s: %s %v", claim.Name, what, got, res.Devices.Results[0].ConsumedCapacity))
		if d, _ := n.model.Lookup(got); d.Sharing.Enabled() != strings.HasPrefix(what, "share") {
			fail("%s %s: got %s", claim.Name, what, got)
			return
		} else if d.Sharing.Enabled() {
			shares++
		}
		order = append(order, claim.Name)
		if _, err := n.holds(); err != nil {
			fail("after %s: %v", claim.Name, err)
			return
		}
	}
	return allocated, noFit, shares
}

// sharing is the node's sharing mode, from its first shared device.
func (n *shareNode) sharing() devicemodel.Sharing {
	for i := range n.model.Devices {
		if s := n.model.Devices[i].Sharing; s.Enabled() {
			return s
		}
	}
	return devicemodel.Sharing{}
}

// roomFor names a shared device that has room for a share asking for
// reqs, given what the GPUs hold; "" if none has.
func (n *shareNode) roomFor(held []gpuHolds, reqs []string) string {
	for i := range n.model.Devices {
		d := &n.model.Devices[i]
		if !d.Sharing.Enabled() {
			continue
		}
		h := held[d.GPU.Index]
		if h.vfio || h.migMask != 0 {
			continue
		}
		want, ok := wouldConsume(d.Sharing, int64(d.GPU.MemoryBytes), reqs)
		if !ok {
			continue
		}
		fits := true
		for name, v := range want {
			capacity := d.API.Capacity[name].Value
			if h.consumed[name]+v > capacity.Value() {
				fits = false
			}
		}
		if fits {
			return d.Name()
		}
	}
	return ""
}
