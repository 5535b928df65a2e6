package devicemodel_test

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"
)

// semverRE is the API server's check of version attributes
// (k8s.io/kubernetes/pkg/apis/resource/validation: semver.org 2.0.0,
// no leading zeroes, exactly three numeric components).
var semverRE = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)` +
	`(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?` +
	`(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$`)

// validateDevice applies the API server's validation rules for one
// published device that a driver can get wrong: the name, the number of
// attributes and capacities, the attribute names and the attribute values,
// and the capacities' request policies (see [validateRequestPolicy]).
// The real validation lives in k8s.io/kubernetes, which a driver must not
// import; k8s.io/dynamic-resource-allocation does not export it.
func validateDevice(d resourceapi.Device) []error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("device %q: "+format, append([]any{d.Name}, args...)...))
	}
	for _, msg := range validation.IsDNS1123Label(d.Name) {
		add("name: %s", msg)
	}
	if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
		add("%d attributes and capacities, more than %d", n, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice)
	}
	values := 0
	for name, a := range d.Attributes {
		for _, msg := range validateQualifiedName(name) {
			add("attribute %q: %s", name, msg)
		}
		set := 0
		if a.IntValue != nil {
			set++
			values++
		}
		if a.BoolValue != nil {
			set++
			values++
		}
		if a.StringValue != nil {
			set++
			values++
			if len(*a.StringValue) > resourceapi.DeviceAttributeMaxValueLength {
				add("attribute %q: string longer than %d", name, resourceapi.DeviceAttributeMaxValueLength)
			}
		}
		if a.VersionValue != nil {
			set++
			values++
			if !semverRE.MatchString(*a.VersionValue) {
				add("attribute %q: version %q is not semver 2.0.0", name, *a.VersionValue)
			}
			if len(*a.VersionValue) > resourceapi.DeviceAttributeMaxValueLength {
				add("attribute %q: version longer than %d", name, resourceapi.DeviceAttributeMaxValueLength)
			}
		}
		for _, list := range []int{len(a.IntValues), len(a.BoolValues), len(a.StringValues), len(a.VersionValues)} {
			if list > 0 {
				set++
				values += list
			}
		}
		if set != 1 {
			add("attribute %q: %d values set, exactly one must be", name, set)
		}
	}
	if values > resourceapi.ResourceSliceMaxAttributeValuesPerDevice {
		add("%d attribute values, more than %d", values, resourceapi.ResourceSliceMaxAttributeValuesPerDevice)
	}
	for name, c := range d.Capacity {
		for _, msg := range validateQualifiedName(name) {
			add("capacity %q: %s", name, msg)
		}
		if c.Value.Sign() < 0 {
			add("capacity %q: negative value %s", name, c.Value.String())
		}
		for _, msg := range validateRequestPolicy(c, ptr.Deref(d.AllowMultipleAllocations, false)) {
			add("capacity %q: requestPolicy: %s", name, msg)
		}
	}
	return errs
}

// validateQualifiedName is the API's rule for attribute and capacity names:
// a C identifier of at most 32 characters, optionally prefixed with a DNS
// subdomain of at most 63 characters and a slash.
func validateQualifiedName(name resourceapi.QualifiedName) []string {
	var msgs []string
	id := string(name)
	if domain, rest, ok := strings.Cut(id, "/"); ok {
		id = rest
		if len(domain) > resourceapi.DeviceMaxDomainLength {
			msgs = append(msgs, fmt.Sprintf("domain longer than %d", resourceapi.DeviceMaxDomainLength))
		}
		msgs = append(msgs, validation.IsDNS1123Subdomain(domain)...)
		if strings.Contains(rest, "/") {
			msgs = append(msgs, "more than one slash")
		}
	}
	if len(id) > resourceapi.DeviceMaxIDLength {
		msgs = append(msgs, fmt.Sprintf("identifier longer than %d", resourceapi.DeviceMaxIDLength))
	}
	msgs = append(msgs, validation.IsCIdentifier(id)...)
	return msgs
}

// validatePool applies the API server's rules for the slices of one pool
// that a driver can get wrong, those of [validateDevice] for every device,
// and the allocator's checks of a pool as a whole (k8s.io/dynamic-resource-
// allocation/structured: unique device and counter set names, consumed
// counters that exist). Slices are numbered from 0 in the errors.
func validatePool(slices []resourceslice.Slice) []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(slices) == 0 {
		add("pool has no slices")
	}
	sets := map[string]map[string]resourceapi.Counter{}
	devices := map[string]bool{}
	for i, s := range slices {
		if s.Devices != nil && s.SharedCounters != nil {
			add("slice %d: only one of devices and sharedCounters may be set", i)
		}
		limit := resourceapi.ResourceSliceMaxDevices
		for _, d := range s.Devices {
			if len(d.Taints) > 0 || len(d.ConsumesCounters) > 0 || hasListAttribute(d) {
				limit = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures
			}
		}
		if len(s.Devices) > limit {
			add("slice %d: %d devices, more than %d", i, len(s.Devices), limit)
		}
		if len(s.SharedCounters) > resourceapi.ResourceSliceMaxCounterSets {
			add("slice %d: %d counter sets, more than %d", i, len(s.SharedCounters), resourceapi.ResourceSliceMaxCounterSets)
		}
		for _, cs := range s.SharedCounters {
			for _, msg := range validation.IsDNS1123Label(cs.Name) {
				add("slice %d: counter set %q: name: %s", i, cs.Name, msg)
			}
			if _, dup := sets[cs.Name]; dup {
				add("slice %d: counter set %q twice in the pool", i, cs.Name)
			}
			sets[cs.Name] = cs.Counters
			for _, err := range validateCounters(cs.Counters) {
				add("slice %d: counter set %q: %v", i, cs.Name, err)
			}
		}
		for _, d := range s.Devices {
			if devices[d.Name] {
				add("slice %d: device %q twice in the pool", i, d.Name)
			}
			devices[d.Name] = true
			errs = append(errs, validateDevice(d)...)
			if n := len(d.ConsumesCounters); n > resourceapi.ResourceSliceMaxDeviceCounterConsumptionsPerDevice {
				add("device %q: %d counter consumptions, more than %d", d.Name, n, resourceapi.ResourceSliceMaxDeviceCounterConsumptionsPerDevice)
			}
			seen := map[string]bool{}
			for _, c := range d.ConsumesCounters {
				for _, msg := range validation.IsDNS1123Label(c.CounterSet) {
					add("device %q: counter set %q: name: %s", d.Name, c.CounterSet, msg)
				}
				if seen[c.CounterSet] {
					add("device %q: consumes from counter set %q twice", d.Name, c.CounterSet)
				}
				seen[c.CounterSet] = true
				for _, err := range validateCounters(c.Counters) {
					add("device %q: consumption from %q: %v", d.Name, c.CounterSet, err)
				}
			}
		}
	}
	// The allocator's checks need all counter sets, so they come last.
	for _, s := range slices {
		for _, d := range s.Devices {
			for _, c := range d.ConsumesCounters {
				set, ok := sets[c.CounterSet]
				if !ok {
					add("device %q: counter set %q is not in the pool", d.Name, c.CounterSet)
					continue
				}
				for name := range c.Counters {
					if _, ok := set[name]; !ok {
						add("device %q: counter %q is not in counter set %q", d.Name, name, c.CounterSet)
					}
				}
			}
		}
	}
	return errs
}

// validateCounters checks the counters of a counter set or of a device's
// consumption: at most 32 (both limits are 32), DNS labels, and, our own
// rule, no negative values.
func validateCounters(counters map[string]resourceapi.Counter) []error {
	var errs []error
	if len(counters) == 0 {
		errs = append(errs, errors.New("no counters"))
	}
	if n := len(counters); n > resourceapi.ResourceSliceMaxCountersPerCounterSet || n > resourceapi.ResourceSliceMaxCountersPerDeviceCounterConsumption {
		errs = append(errs, fmt.Errorf("%d counters, more than %d", n, min(resourceapi.ResourceSliceMaxCountersPerCounterSet, resourceapi.ResourceSliceMaxCountersPerDeviceCounterConsumption)))
	}
	for name, c := range counters {
		for _, msg := range validation.IsDNS1123Label(name) {
			errs = append(errs, fmt.Errorf("counter %q: %s", name, msg))
		}
		if c.Value.Sign() < 0 {
			errs = append(errs, fmt.Errorf("counter %q: negative value %s", name, c.Value.String()))
		}
	}
	return errs
}

func hasListAttribute(d resourceapi.Device) bool {
	for _, a := range d.Attributes {
		if a.IntValues != nil || a.BoolValues != nil || a.StringValues != nil || a.VersionValues != nil {
			return true
		}
	}
	return false
}
