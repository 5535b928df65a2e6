package devicemodel_test

import (
	"fmt"
	"regexp"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// semverRE is the API server's check of version attributes
// (k8s.io/kubernetes/pkg/apis/resource/validation: semver.org 2.0.0,
// no leading zeroes, exactly three numeric components).
var semverRE = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)` +
	`(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?` +
	`(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$`)

// validateDevice applies the API server's validation rules for one
// published device that a driver can get wrong: the name, the number of
// attributes and capacities, the attribute names and the attribute values.
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
		if c.RequestPolicy != nil {
			add("capacity %q: requestPolicy needs allowMultipleAllocations", name)
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
