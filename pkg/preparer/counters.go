package preparer

import (
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
)

// counterKey names one counter of one counter set.
type counterKey struct{ set, counter string }

// counterUse is what the claims hold of one counter, and the claim with
// the lowest UID among those holding it.
type counterUse struct {
	key    counterKey
	used   int64
	holder *claimstate.Claim
}

// counterUses is a table of the counters of the sets a claim consumes: a
// dozen or so (a set or two of one GPU's), which a scan finds faster than
// a map is built, and this runs twice per Prepare.
type counterUses []counterUse

// at returns k's entry, adding an empty one if there is none.
func (u *counterUses) at(k counterKey) *counterUse {
	for i := range *u {
		if (*u)[i].key == k {
			return &(*u)[i]
		}
	}
	*u = append(*u, counterUse{key: k})
	return &(*u)[len(*u)-1]
}

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
// and devices the model does not publish (any more) are not charged. When
// a counter is exceeded, the claim with the lowest UID among those holding
// it is named.
//
// It runs twice per Prepare, inside checkpoint transactions, so it looks
// only at the counter sets the claim's own devices consume: a node's
// model has a set of a dozen counters per GPU, and other claims' devices
// on other GPUs cannot change the outcome.
func checkCounters(model *devicemodel.Model, pool string, s *claimstate.State, claim *claimstate.Claim) error {
	if model == nil {
		return nil
	}
	var sets []string // the counter sets the claim's devices consume
	for _, d := range claim.Devices {
		for _, cc := range consumed(model, pool, d) {
			if !slices.Contains(sets, cc.CounterSet) {
				sets = append(sets, cc.CounterSet)
			}
		}
	}
	if len(sets) == 0 {
		return nil
	}
	// What the other claims hold of those sets: each device once, named
	// by the claim with the lowest UID that holds it.
	var uses counterUses
	var charged map[string]*claimstate.Claim
	for uid, other := range s.Claims {
		if uid == claim.UID {
			continue
		}
		for _, d := range other.Devices {
			ccs := consumed(model, pool, d)
			if !consumesAny(ccs, sets) {
				continue
			}
			if charged == nil {
				charged = map[string]*claimstate.Claim{}
			}
			if first, ok := charged[d.Name]; ok {
				if other.UID < first.UID {
					charged[d.Name] = other
				}
				continue
			}
			charged[d.Name] = other
		}
	}
	for name, other := range charged {
		dev, _ := model.Lookup(name)
		for _, cc := range dev.API.ConsumesCounters {
			if !slices.Contains(sets, cc.CounterSet) {
				continue
			}
			for counter, c := range cc.Counters {
				u := uses.at(counterKey{cc.CounterSet, counter})
				u.used += c.Value.Value()
				if u.holder == nil || other.UID < u.holder.UID {
					u.holder = other
				}
			}
		}
	}
	for i, d := range claim.Devices {
		// A device is charged once: it may be held by another claim, or
		// named twice in this one.
		if charged[d.Name] != nil || slices.ContainsFunc(claim.Devices[:i], func(e claimstate.Device) bool { return e.Name == d.Name }) {
			continue
		}
		for _, cc := range consumed(model, pool, d) {
			set := counterSet(model, cc.CounterSet)
			for counter, c := range cc.Counters {
				u := uses.at(counterKey{cc.CounterSet, counter})
				v := c.Value.Value()
				limit, known := set[counter]
				if known && u.used+v > limit.Value.Value() && u.holder != nil {
					return &RefusedError{Err: fmt.Errorf("device %s/%s needs %d of counter %s of %s, of which claim %s/%s (uid %s) and others prepared here hold %d of %d: "+
						"the scheduler handed it out again (after a pod was deleted by force?); retried until they are unprepared",
						d.Pool, d.Name, v, counter, cc.CounterSet, u.holder.Namespace, u.holder.Name, u.holder.UID, u.used, limit.Value.Value())}
				}
				u.used += v
			}
		}
	}
	return nil
}

// consumed returns the counters a device of a claim is charged: none for
// an admin-access device, another pool's or one the model does not
// publish.
func consumed(model *devicemodel.Model, pool string, d claimstate.Device) []resourceapi.DeviceCounterConsumption {
	if d.AdminAccess || d.Pool != pool {
		return nil
	}
	dev, ok := model.Lookup(d.Name)
	if !ok {
		return nil
	}
	return dev.API.ConsumesCounters
}

func consumesAny(ccs []resourceapi.DeviceCounterConsumption, sets []string) bool {
	for _, cc := range ccs {
		if slices.Contains(sets, cc.CounterSet) {
			return true
		}
	}
	return false
}

// counterSet returns the counters of the model's set of that name; nil
// when the model has none of that name.
func counterSet(model *devicemodel.Model, name string) map[string]resourceapi.Counter {
	for i := range model.CounterSets {
		if model.CounterSets[i].Name == name {
			return model.CounterSets[i].Counters
		}
	}
	return nil
}
