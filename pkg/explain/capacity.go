package explain

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// capacityCheck says whether a device can give a request the capacity it
// asks for (consumable capacity, KEP-5075), as the allocator rounds and
// limits it by the device's request policy: at all (ever), and with what
// other claims hold of it now. why names the first capacity that does not
// fit.
func capacityCheck(asked *resourceapi.CapacityRequirements, d *device) (ever, now bool, why string) {
	if asked != nil {
		for name := range asked.Requests {
			if _, ok := d.api.Capacity[name]; !ok {
				return false, false, fmt.Sprintf("has no capacity %s", name)
			}
		}
	}
	now = true
	for name, capacity := range d.api.Capacity {
		var req *resource.Quantity
		if asked != nil {
			if q, ok := asked.Requests[name]; ok {
				req = &q
			}
		}
		take := consumed(req, capacity)
		if violatesPolicy(take, capacity.RequestPolicy) {
			return false, false, fmt.Sprintf("capacity %s: %s is outside the device's request policy", name, take.String())
		}
		if take.Cmp(capacity.Value) > 0 {
			return false, false, fmt.Sprintf("capacity %s: asks for %s, the device has %s", name, take.String(), capacity.Value.String())
		}
		if held, ok := d.consumed[name]; ok && now {
			sum := held.DeepCopy()
			sum.Add(take)
			if sum.Cmp(capacity.Value) > 0 {
				left := capacity.Value.DeepCopy()
				left.Sub(held)
				now, why = false, fmt.Sprintf("capacity %s: asks for %s, %s of %s left", name, take.String(), left.String(), capacity.Value.String())
			}
		}
	}
	return true, now, why
}

// consumed is what a request takes of one capacity: what it asks for,
// rounded up as the policy says, or the policy's default (else all of it)
// when it does not ask.
func consumed(req *resource.Quantity, c resourceapi.DeviceCapacity) resource.Quantity {
	p := c.RequestPolicy
	switch {
	case req == nil && p != nil && p.Default != nil:
		return p.Default.DeepCopy()
	case req == nil:
		return c.Value.DeepCopy()
	case p == nil:
		return req.DeepCopy()
	case p.ValidRange != nil && p.ValidRange.Min != nil:
		r := p.ValidRange
		if req.Cmp(*r.Min) < 0 {
			return r.Min.DeepCopy()
		}
		if r.Step == nil || r.Step.IsZero() {
			return req.DeepCopy()
		}
		// In milli-units, as the allocator does for fractional steps;
		// capacities beyond the milli range are rare enough to round in
		// units.
		scale, value := resource.Milli, func(q resource.Quantity) int64 { return q.MilliValue() }
		if req.Value() > (1<<63-1)/1000 {
			scale, value = 0, func(q resource.Quantity) int64 { return q.Value() }
		}
		lo, step := value(*r.Min), value(*r.Step)
		if step <= 0 {
			return req.DeepCopy()
		}
		n := (value(*req) - lo + step - 1) / step
		return *resource.NewScaledQuantity(lo+n*step, scale)
	case len(p.ValidValues) > 0:
		for _, v := range p.ValidValues {
			if v.Cmp(*req) >= 0 {
				return v.DeepCopy()
			}
		}
	}
	return req.DeepCopy()
}

func violatesPolicy(q resource.Quantity, p *resourceapi.CapacityRequestPolicy) bool {
	switch {
	case p == nil:
		return false
	case p.ValidRange != nil:
		return p.ValidRange.Max != nil && q.Cmp(*p.ValidRange.Max) > 0
	case len(p.ValidValues) > 0:
		for _, v := range p.ValidValues {
			if v.Cmp(q) == 0 {
				return false
			}
		}
		return true
	}
	return false
}
