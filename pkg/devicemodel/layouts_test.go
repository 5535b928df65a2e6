package devicemodel_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
)

// placement is one profile at one start of a simulated model's table.
type placement struct {
	profile sim.MIGProfile
	start   int
}

func (p placement) String() string { return fmt.Sprintf("%s@%d", p.profile.Name, p.start) }

func (p placement) overlaps(q placement) bool {
	return p.start < q.start+q.profile.PlacementSize && q.start < p.start+p.profile.PlacementSize
}

// legalLayout reports whether the table allows the placements together on
// a GPU whose whole-GPU profile is whole: no two share a memory slice, no
// profile has more instances than it may, and together they need no more
// engines than the GPU has (on A30 the 1g and 2g +me profiles share its
// one JPEG and OFA engine).
func legalLayout(whole sim.MIGProfile, ps []placement) bool {
	var sum sim.MIGProfile
	for _, p := range ps {
		q := p.profile
		sum.Multiprocessors += q.Multiprocessors
		sum.CopyEngines += q.CopyEngines
		sum.Decoders += q.Decoders
		sum.Encoders += q.Encoders
		sum.JPEGEngines += q.JPEGEngines
		sum.OFAEngines += q.OFAEngines
	}
	if sum.Multiprocessors > whole.Multiprocessors || sum.CopyEngines > whole.CopyEngines || sum.Decoders > whole.Decoders ||
		sum.Encoders > whole.Encoders || sum.JPEGEngines > whole.JPEGEngines || sum.OFAEngines > whole.OFAEngines {
		return false
	}
	count := map[string]int{}
	for i, p := range ps {
		for _, q := range ps[:i] {
			if p.overlaps(q) {
				return false
			}
		}
		count[p.profile.Name]++
		if count[p.profile.Name] > p.profile.Instances {
			return false
		}
	}
	return true
}

// fitsCounters reports whether the devices' consumptions fit into the
// counter set together, as the allocator judges it.
func fitsCounters(set resourceapi.CounterSet, devices []*devicemodel.Device) bool {
	used := map[string]int64{}
	for _, d := range devices {
		for _, c := range d.API.ConsumesCounters {
			if c.CounterSet != set.Name {
				return false
			}
			for name, v := range c.Counters {
				used[name] += v.Value.Value()
			}
		}
	}
	for name, v := range used {
		total, ok := set.Counters[name]
		if !ok || v > total.Value.Value() {
			return false
		}
	}
	return true
}

// TestDynamicMIGLayouts checks, for every simulated MIG model, that the
// counters allow exactly the layouts the profile table allows: every set
// of placements without two on one memory slice is either legal and fits
// the counters, or breaks an instance limit and does not; and no two
// overlapping placements fit together. The engine totals of the whole-GPU
// profile must not make a legal layout unallocatable.
func TestDynamicMIGLayouts(t *testing.T) {
	for _, name := range migModels(t) {
		t.Run(name, func(t *testing.T) {
			sm := simModel(t, name)
			whole := wholeSimProfile(t, sm)
			m := buildDynamic(t, inventoryOf(simGPU(t, 0, name, true)))
			set := m.CounterSets[0]
			var all []placement
			device := map[string]*devicemodel.Device{}
			for _, p := range sm.MIGProfiles {
				for _, s := range p.PlacementStarts {
					pl := placement{p, s}
					d, ok := m.Lookup(devicemodel.MIGName(0, p.Name, p.ID, s))
					if !ok {
						t.Fatalf("%v: no device", pl)
					}
					all = append(all, pl)
					device[pl.String()] = d
				}
			}
			devicesOf := func(ps []placement) []*devicemodel.Device {
				var out []*devicemodel.Device
				for _, p := range ps {
					out = append(out, device[p.String()])
				}
				return out
			}

			for i, p := range all {
				for _, q := range all[:i] {
					if p.overlaps(q) && fitsCounters(set, devicesOf([]placement{p, q})) {
						t.Errorf("%v and %v overlap, but fit the counters together", p, q)
					}
				}
			}

			// Every set of placements on distinct memory slices.
			var layouts, legal int
			var walk func(from int, chosen []placement)
			walk = func(from int, chosen []placement) {
				layouts++
				isLegal, fits := legalLayout(whole, chosen), fitsCounters(set, devicesOf(chosen))
				if isLegal {
					legal++
				}
				if isLegal != fits {
					t.Errorf("layout %v: legal by the table %v, fits the counters %v", chosen, isLegal, fits)
				}
				for i := from; i < len(all); i++ {
					free := true
					for _, c := range chosen {
						free = free && !c.overlaps(all[i])
					}
					if free {
						walk(i+1, append(slices.Clip(chosen), all[i]))
					}
				}
			}
			walk(0, nil)
			t.Logf("%d layouts on distinct memory slices, %d legal", layouts, legal)

			// The layouts NVIDIA documents, by profile index in -lgip order:
			// on 8-memory-slice GPUs 1g, 1g+me, 1g with 2 memory slices, 2g,
			// 3g, 4g, 7g; on A30 1g, 1g+me, 2g, 2g+me, 4g.
			named := map[string][][2]int{
				"7x1g":         {{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}, {0, 5}, {0, 6}},
				"4g+3g":        {{5, 0}, {4, 4}},
				"3x2g+1g":      {{3, 0}, {3, 2}, {3, 4}, {0, 6}},
				"4x1g 2-slice": {{2, 0}, {2, 2}, {2, 4}, {2, 6}},
				"1g+me+6x1g":   {{1, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}, {0, 5}, {0, 6}},
				"7g":           {{6, 0}},
				"2x3g":         {{4, 0}, {4, 4}},
			}
			if sm.MemorySlices == 4 {
				named = map[string][][2]int{
					"4x1g":       {{0, 0}, {0, 1}, {0, 2}, {0, 3}},
					"1g+me+3x1g": {{1, 0}, {0, 1}, {0, 2}, {0, 3}},
					"2x2g":       {{2, 0}, {2, 2}},
					"2g+me+2x1g": {{3, 0}, {0, 2}, {0, 3}},
					"2g+2x1g":    {{2, 2}, {0, 0}, {1, 1}},
					"4g":         {{4, 0}},
				}
				// The two +me profiles share the GPU's one JPEG and OFA engine.
				if both := []placement{{sm.MIGProfiles[1], 0}, {sm.MIGProfiles[3], 2}}; legalLayout(whole, both) || fitsCounters(set, devicesOf(both)) {
					t.Errorf("%v: legal %v, fits the counters %v; want neither", both, legalLayout(whole, both), fitsCounters(set, devicesOf(both)))
				}
			}
			for label, layout := range named {
				var ps []placement
				for _, l := range layout {
					ps = append(ps, placement{sm.MIGProfiles[l[0]], l[1]})
				}
				if !legalLayout(whole, ps) || !fitsCounters(set, devicesOf(ps)) {
					t.Errorf("%s %v: legal %v, fits the counters %v; want both", label, ps, legalLayout(whole, ps), fitsCounters(set, devicesOf(ps)))
				}
			}
			// Two +me instances break the table's limit of one.
			me := sm.MIGProfiles[1]
			if !strings.HasSuffix(me.Name, "+me") {
				t.Fatalf("profile 1 is %s, the named layouts above assume -lgip order", me.Name)
			}
			if two := []placement{{me, 0}, {me, 1}}; me.Instances != 1 || fitsCounters(set, devicesOf(two)) {
				t.Errorf("%s: two instances fit the counters (table: %d instances)", me.Name, me.Instances)
			}
		})
	}
}
