package claimconfig

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

// ClassKindFunc tells the kind of device a DeviceClass selects, false when
// it cannot be told (a class of another driver, or one that selects
// several kinds).
type ClassKindFunc func(className string) (DeviceKind, bool)

// CheckFit returns the configs of driver in a claim spec that Resolve
// would refuse at Prepare whatever devices the allocator picks, because
// their kind does not fit the kind of device the requests' DeviceClasses
// select: a config naming a request that gets, say, a full GPU, or a
// config for all requests that fits none of them. It applies Resolve's
// rules (the last config that applies wins) to the spec alone, so it can
// run before allocation; a request whose class classKind cannot tell, or
// a firstAvailable request one of whose subrequests a config fits, is
// left to Prepare. Configs that do not decode are left out: the caller
// reports them with [DecodeParameters].
func CheckFit(driver string, spec *resourceapi.ResourceClaimSpec, classKind ClassKindFunc, features v1beta1.Features) []*ConfigError {
	var configs []resourceapi.DeviceAllocationConfiguration
	for _, c := range spec.Devices.Config {
		configs = append(configs, resourceapi.DeviceAllocationConfiguration{
			Source: resourceapi.AllocationConfigSourceClaim, Requests: c.Requests, DeviceConfiguration: c.DeviceConfiguration})
	}
	candidates, _ := decodeConfigs(driver, configs, features)
	if len(candidates) == 0 {
		return nil
	}
	type alternative struct {
		request, class string
		kind           DeviceKind
	}
	var errs []*ConfigError
	possible := map[DeviceKind]bool{} // every kind the claim may get
	allKnown := true
	for _, r := range spec.Devices.Requests {
		var alts []alternative
		switch {
		case r.Exactly != nil:
			alts = []alternative{{request: r.Name, class: r.Exactly.DeviceClassName}}
		default:
			for _, sub := range r.FirstAvailable {
				alts = append(alts, alternative{request: r.Name + "/" + sub.Name, class: sub.DeviceClassName})
			}
		}
		known := len(alts) > 0
		for i := range alts {
			var ok bool
			if alts[i].kind, ok = classKind(alts[i].class); !ok {
				known = false
				break
			}
			possible[alts[i].kind] = true
		}
		if !known {
			allKnown = false
			continue
		}
		// Refused only when every alternative would be refused, by the
		// same config.
		var refused *ConfigError
		for i, a := range alts {
			// choose fails exactly when the config that wins for the
			// request names it and does not fit its kind.
			_, err := choose(candidates, resourceapi.DeviceRequestAllocationResult{Request: a.request}, a.kind)
			var ce *ConfigError
			if !errors.As(err, &ce) || (i > 0 && ce.Origin.Index != refused.Origin.Index) {
				refused = nil
				break
			}
			cfg := candidateAt(candidates, ce.Origin).config
			refused = &ConfigError{Origin: ce.Origin, Err: fmt.Errorf(
				"a %s cannot configure request %q: its DeviceClass %s gives %s; use a %s",
				cfg.GetObjectKind().GroupVersionKind().Kind, r.Name, a.class, deviceKindName[a.kind], configKind[a.kind])}
		}
		if refused != nil {
			errs = append(errs, refused)
		}
	}
	if !allKnown || len(spec.Devices.Requests) == 0 {
		return errs
	}
	for _, c := range candidates {
		kind := kindConfigured(c.config)
		if len(c.origin.Requests) > 0 || possible[kind] {
			continue
		}
		var want []string
		for _, k := range slices.Sorted(maps.Keys(possible)) {
			want = append(want, configKind[k])
		}
		errs = append(errs, &ConfigError{Origin: c.origin, Err: fmt.Errorf(
			"a %s configures %s only, and the DeviceClasses of this claim's requests give none; use a %s",
			c.config.GetObjectKind().GroupVersionKind().Kind, pluralKindName[kind], strings.Join(want, " or a "))})
	}
	return errs
}

// candidateAt returns the candidate of origin.
func candidateAt(candidates []candidate, origin Origin) candidate {
	for _, c := range candidates {
		if c.origin.Source == origin.Source && c.origin.Index == origin.Index {
			return c
		}
	}
	return candidate{}
}
