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

// legalLayout reports whether the table allows the placements together:
// no two share a memory slice and no profile has more instances than it
// may.
func legalLayout(ps []placement) bool {
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
// overlapping placements fit together. The engine totals of the 7g
// profile must not make a legal layout unallocatable.
func TestDynamicMIGLayouts(t *testing.T) {
	for _, name := range migModels(t) {
		t.Run(name, func(t *testing.T) {
			sm := simModel(t, name)
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
				isLegal, fits := legalLayout(chosen), fitsCounters(set, devicesOf(chosen))
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

			// The layouts NVIDIA documents, by profile index in -lgip order
			// (1g, 1g+me, 1g with 2 memory slices, 2g, 3g, 4g, 7g).
			named := map[string][][2]int{
				"7x1g":         {{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}, {0, 5}, {0, 6}},
				"4g+3g":        {{5, 0}, {4, 4}},
				"3x2g+1g":      {{3, 0}, {3, 2}, {3, 4}, {0, 6}},
				"4x1g 2-slice": {{2, 0}, {2, 2}, {2, 4}, {2, 6}},
				"1g+me+6x1g":   {{1, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}, {0, 5}, {0, 6}},
				"7g":           {{6, 0}},
				"2x3g":         {{4, 0}, {4, 4}},
			}
			for label, layout := range named {
				var ps []placement
				for _, l := range layout {
					ps = append(ps, placement{sm.MIGProfiles[l[0]], l[1]})
				}
				if !legalLayout(ps) || !fitsCounters(set, devicesOf(ps)) {
					t.Errorf("%s %v: legal %v, fits the counters %v; want both", label, ps, legalLayout(ps), fitsCounters(set, devicesOf(ps)))
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
