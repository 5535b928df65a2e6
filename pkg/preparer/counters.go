package preparer

import (
	"fmt"
	"maps"
	"slices"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
)

// counterKey names one counter of one counter set.
type counterKey struct{ set, counter string }

// checkCounters refuses claim when its devices, with those every other
// claim of the state holds (started or completed), would use a shared
// counter of the published model beyond its capacity: the scheduler's own
// rule, checked again on the node, where a claim whose pod was deleted by
// force still holds its devices while the scheduler has handed their
// counters out again. Two MIG placements that do not overlap in memory
// slices can still both need the GPU's one optical flow engine (two
// 1g.10gb+me devices; chaos seed 636); a full GPU, its VFIO device and its
// MIG devices share its whole counter set.
//
// A device is charged once however many claims hold it (shares of a
// shareable device, as the scheduler counts them); admin-access devices
// and devices the model does not publish (any more) are not charged.
func checkCounters(model *devicemodel.Model, pool string, s *claimstate.State, claim *claimstate.Claim) error {
	if model == nil {
		return nil
	}
	capacity := map[counterKey]int64{}
	for _, set := range model.CounterSets {
		for name, c := range set.Counters {
			capacity[counterKey{set.Name, name}] = c.Value.Value()
		}
	}
	used := map[counterKey]int64{}
	holder := map[counterKey]*claimstate.Claim{}
	charged := map[string]bool{}
	consumption := func(d claimstate.Device) map[counterKey]int64 {
		if d.AdminAccess || d.Pool != pool || charged[d.Name] {
			return nil
		}
		dev, ok := model.Lookup(d.Name)
		if !ok {
			return nil
		}
		out := map[counterKey]int64{}
		for _, cc := range dev.API.ConsumesCounters {
			for name, c := range cc.Counters {
				out[counterKey{cc.CounterSet, name}] += c.Value.Value()
			}
		}
		return out
	}
	for _, uid := range slices.Sorted(maps.Keys(s.Claims)) {
		other := s.Claims[uid]
		if uid == claim.UID {
			continue
		}
		for _, d := range other.Devices {
			for k, v := range consumption(d) {
				used[k] += v
				if holder[k] == nil {
					holder[k] = other
				}
			}
			charged[d.Name] = true
		}
	}
	for _, d := range claim.Devices {
		for k, v := range consumption(d) {
			limit, known := capacity[k]
			if h := holder[k]; known && used[k]+v > limit && h != nil {
				return &RefusedError{Err: fmt.Errorf("device %s/%s needs %d of counter %s of %s, of which claim %s/%s (uid %s) and others prepared here hold %d of %d: "+
					"the scheduler handed it out again (after a pod was deleted by force?); retried until they are unprepared",
					d.Pool, d.Name, v, k.counter, k.set, h.Namespace, h.Name, h.UID, used[k], limit)}
			}
			used[k] += v
		}
		charged[d.Name] = true
	}
	return nil
}
