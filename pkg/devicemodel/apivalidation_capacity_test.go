package devicemodel_test

import (
	"fmt"
	"math"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

// maxValidValues is how many validValues a request policy may list
// (CapacityRequestPolicyDiscreteMaxOptions in k8s.io/kubernetes
// pkg/apis/resource/types.go; k8s.io/api does not export it).
const maxValidValues = 10

// validateRequestPolicy applies the API server's rules for a capacity's
// request policy (KEP-5075), as k8s.io/kubernetes v1.37.1 has them in
// pkg/apis/resource/validation/validation.go (validateDevice,
// validateMultiAllocatableDeviceCapacity, validateSingleAllocatableDeviceCapacity,
// validateRequestPolicy, validateRequestPolicyValidValues,
// validateRequestPolicyRange, validateRequestPolicyRangeStep): a policy
// needs allowMultipleAllocations; validValues and validRange exclude each
// other and each needs a default; validValues holds at most 10 unique
// values, sorted, none above the capacity, the default among them;
// validRange has a min within the capacity, a default within [min, max],
// a max within the capacity, and a positive step with min+step within the
// capacity, of which default and max are whole steps from min. Values are
// checked with integer arithmetic, as the API server does for ranges
// without fractions; gpudra publishes no fractions, so a range with one is
// refused.
func validateRequestPolicy(c resourceapi.DeviceCapacity, allowMultipleAllocations bool) []string {
	p := c.RequestPolicy
	if p == nil {
		return nil
	}
	if !allowMultipleAllocations {
		return []string{"forbidden: allowMultipleAllocations must be true"}
	}
	var msgs []string
	add := func(format string, args ...any) { msgs = append(msgs, fmt.Sprintf(format, args...)) }
	switch {
	case len(p.ValidValues) > 0 && p.ValidRange != nil:
		add("validValues and validRange are both set")
	case len(p.ValidValues) > 0:
		if p.Default == nil {
			add("validValues: default is required")
			break
		}
		if len(p.ValidValues) > maxValidValues {
			add("validValues: %d values, more than %d", len(p.ValidValues), maxValidValues)
		}
		foundDefault := false
		for i, v := range p.ValidValues {
			if i > 0 && p.ValidValues[i-1].Cmp(v) >= 0 {
				add("validValues[%d] %s: values must be unique and sorted in ascending order", i, v.String())
			}
			if v.Cmp(c.Value) > 0 {
				add("validValues[%d] %s: larger than the capacity %s", i, v.String(), c.Value.String())
			}
			if v.Cmp(*p.Default) == 0 {
				foundDefault = true
			}
		}
		if !foundDefault {
			add("validValues: default %s is not one of them", p.Default.String())
		}
	case p.ValidRange != nil:
		msgs = append(msgs, validateRange(c.Value, p.Default, *p.ValidRange)...)
	}
	return msgs
}

// validateRange is the part of [validateRequestPolicy] for validRange.
func validateRange(capacity resource.Quantity, def *resource.Quantity, r resourceapi.CapacityRequestPolicyRange) []string {
	var msgs []string
	add := func(format string, args ...any) { msgs = append(msgs, fmt.Sprintf(format, args...)) }
	if def == nil {
		return []string{"validRange: default is required"}
	}
	if r.Min == nil {
		return []string{"validRange: min is required"}
	}
	ints := map[string]int64{}
	for name, q := range map[string]*resource.Quantity{"default": def, "min": r.Min, "max": r.Max, "step": r.Step} {
		if q == nil {
			continue
		}
		v, ok := q.AsInt64()
		if !ok || v < 0 {
			add("validRange: %s %s: not a whole number from 0 to %d", name, q.String(), int64(math.MaxInt64))
			continue
		}
		ints[name] = v
	}
	if len(msgs) > 0 {
		return msgs
	}
	if r.Min.Cmp(capacity) > 0 {
		add("validRange: min %s is larger than the capacity %s", r.Min.String(), capacity.String())
	}
	if def.Cmp(*r.Min) < 0 {
		add("validRange: default %s is less than min %s", def.String(), r.Min.String())
	}
	if r.Max != nil {
		if r.Min.Cmp(*r.Max) > 0 {
			add("validRange: min %s is larger than max %s", r.Min.String(), r.Max.String())
		}
		if r.Max.Cmp(capacity) > 0 {
			add("validRange: max %s is larger than the capacity %s", r.Max.String(), capacity.String())
		}
		if def.Cmp(*r.Max) > 0 {
			add("validRange: default %s is more than max %s", def.String(), r.Max.String())
		}
	}
	if r.Step == nil {
		return msgs
	}
	step := ints["step"]
	if step <= 0 {
		return append(msgs, fmt.Sprintf("validRange: step %s must be greater than zero", r.Step.String()))
	}
	oneStep := r.Min.DeepCopy()
	oneStep.Add(*r.Step)
	if oneStep.Cmp(capacity) > 0 {
		add("validRange: one step %s from min is larger than the capacity %s", oneStep.String(), capacity.String())
	}
	for _, name := range []string{"default", "max"} {
		if v, ok := ints[name]; ok && (v-ints["min"])%step != 0 {
			add("validRange: %s %d is not a multiple of step %d from min %d", name, v, step, ints["min"])
		}
	}
	return msgs
}

// TestValidateRequestPolicyRejects makes sure the request policy
// validator can fail, for each rule it mirrors.
func TestValidateRequestPolicyRejects(t *testing.T) {
	q := resource.MustParse
	// rng makes a range policy; "-" leaves a field out.
	rng := func(def, lo, hi, step string) *resourceapi.CapacityRequestPolicy {
		opt := func(s string) *resource.Quantity {
			if s == "-" {
				return nil
			}
			return ptr.To(q(s))
		}
		return &resourceapi.CapacityRequestPolicy{Default: opt(def), ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: opt(lo), Max: opt(hi), Step: opt(step)}}
	}
	values := func(def string, vs ...string) *resourceapi.CapacityRequestPolicy {
		p := &resourceapi.CapacityRequestPolicy{}
		if def != "-" {
			p.Default = ptr.To(q(def))
		}
		for _, v := range vs {
			p.ValidValues = append(p.ValidValues, q(v))
		}
		return p
	}
	tests := []struct {
		name     string
		policy   *resourceapi.CapacityRequestPolicy
		multiple bool
		want     string
	}{
		{"policy without allowMultipleAllocations", rng("1", "1", "4", "1"), false, "allowMultipleAllocations must be true"},
		{"both", &resourceapi.CapacityRequestPolicy{Default: ptr.To(q("1")), ValidValues: []resource.Quantity{q("1")}, ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(q("1"))}}, true, "both set"},
		{"values without default", values("-", "1"), true, "default is required"},
		{"values unsorted", values("1", "2", "1"), true, "ascending"},
		{"values repeated", values("1", "1", "1"), true, "unique"},
		{"value above capacity", values("1", "1", "5"), true, "larger than the capacity"},
		{"default not a value", values("3", "1", "2"), true, "not one of them"},
		{"eleven values", values("0", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10"), true, "more than 10"},
		{"range without default", rng("-", "1", "4", "1"), true, "default is required"},
		{"range without min", rng("1", "-", "4", "1"), true, "min is required"},
		{"min above capacity", rng("5", "5", "-", "-"), true, "min 5 is larger than the capacity"},
		{"default below min", rng("0", "1", "4", "1"), true, "default 0 is less than min"},
		{"default above max", rng("4", "1", "3", "1"), true, "default 4 is more than max"},
		{"max above capacity", rng("1", "1", "5", "1"), true, "max 5 is larger than the capacity"},
		{"min above max", rng("3", "3", "2", "-"), true, "min 3 is larger than max"},
		{"zero step", rng("1", "1", "4", "0"), true, "greater than zero"},
		{"step past capacity", rng("1", "1", "1", "4"), true, "one step 5 from min"},
		{"default off step", rng("1", "0", "4", "2"), true, "default 1 is not a multiple of step 2"},
		{"max off step", rng("0", "0", "3", "2"), true, "max 3 is not a multiple of step 2"},
		{"fraction", rng("1", "500m", "4", "1"), true, "min 500m: not a whole number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := resourceapi.Device{Name: "gpu-0", Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"shares": {Value: q("4"), RequestPolicy: tt.policy}}}
			if tt.multiple {
				d.AllowMultipleAllocations = ptr.To(true)
			}
			errs := validateDevice(d)
			for _, err := range errs {
				if strings.Contains(err.Error(), tt.want) {
					return
				}
			}
			t.Errorf("errors %v do not mention %q", errs, tt.want)
		})
	}
	ok := resourceapi.Device{Name: "gpu-0", AllowMultipleAllocations: ptr.To(true), Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		"shares": {Value: q("4"), RequestPolicy: rng("2", "0", "4", "2")},
		"memory": {Value: q("4"), RequestPolicy: values("0", "0", "4")},
		"plain":  {Value: q("4"), RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: ptr.To(q("9"))}},
	}}
	if errs := validateDevice(ok); len(errs) > 0 {
		t.Errorf("valid policies refused: %v", errs)
	}
}
