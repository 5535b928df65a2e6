package claimconfig

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

// DeviceKindFunc tells the kind of the device an allocation result of this
// driver refers to; the kubelet plugin answers from its device list. An
// error aborts Resolve and is returned with the device named.
type DeviceKindFunc func(result resourceapi.DeviceRequestAllocationResult) (DeviceKind, error)

// Device is the effective configuration of one allocated device.
type Device struct {
	// Result is the allocation result of the device.
	Result resourceapi.DeviceRequestAllocationResult
	// Kind is the kind of the device.
	Kind DeviceKind
	// Config is a *v1beta1.GpuConfig for a GPU, a *v1beta1.MigDeviceConfig
	// for a MIG device and a *v1beta1.VfioDeviceConfig for a VFIO device,
	// normalized and valid. Devices that got the same
	// config share one object, because one setting (such as one MPS daemon)
	// serves them together; treat it as read-only.
	Config v1beta1.Config
	// Origin is where Config came from.
	Origin Origin
}

// Group is a config with the devices it configures.
type Group struct {
	// Origin is where Config came from.
	Origin Origin
	// Config is the config the devices share.
	Config v1beta1.Config
	// Devices are the devices Config configures, in allocation order.
	Devices []Device
}

// candidate is a config of this driver, decoded.
type candidate struct {
	origin Origin
	config v1beta1.Config
}

// Resolve returns the effective config of every device allocated to claim
// from driver, in allocation order; see the package documentation for the
// rules. Results of other drivers are left out. features is what the
// configs are validated against.
//
// A problem with the claim's configs is returned as one or more
// *ConfigError (use errors.As), all of them at once; other errors come from
// kindOf or mean the claim is not allocated.
func Resolve(driver string, claim *resourceapi.ResourceClaim, kindOf DeviceKindFunc, features v1beta1.Features) ([]Device, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	allocated := claim.Status.Allocation.Devices
	candidates, errs := decodeConfigs(driver, configsOf(claim), features)
	if len(errs) > 0 {
		return nil, errorList(errs)
	}

	defaults := make(map[DeviceKind]v1beta1.Config)
	var devices []Device
	for _, result := range allocated.Results {
		if result.Driver != driver {
			continue
		}
		kind, err := kindOf(result)
		if err != nil {
			return nil, fmt.Errorf("device %q (request %q): %w", result.Device, result.Request, err)
		}
		if _, known := configKind[kind]; !known {
			return nil, fmt.Errorf("device %q (request %q): unsupported device kind %q", result.Device, result.Request, kind)
		}
		device := Device{Result: result, Kind: kind}
		winner, err := choose(candidates, result, kind)
		switch {
		case err != nil:
			errs = append(errs, err)
			continue
		case winner != nil:
			device.Config, device.Origin = winner.config, winner.origin
		default:
			if defaults[kind] == nil {
				defaults[kind] = defaultConfig(kind)
			}
			device.Config, device.Origin = defaults[kind], Origin{Index: -1}
		}
		devices = append(devices, device)
	}
	errs = append(errs, unfitting(candidates, devices)...)
	if len(errs) > 0 {
		return nil, errorList(errs)
	}
	return devices, nil
}

// configsOf returns the configs of claim's allocation, with the claim's own
// configs as its spec has them. The allocator clears the request list of a
// config that names every request of the claim, so in the allocation a
// MigDeviceConfig written for the one request of a claim that got a full GPU
// reads as a config for all requests, which applies only where it fits, and
// would be ignored without a word. The spec is immutable and says what the
// user wrote. A claim's config that names a request the allocator did not
// choose (a subrequest of firstAvailable not taken) configures nothing
// either way.
func configsOf(claim *resourceapi.ResourceClaim) []resourceapi.DeviceAllocationConfiguration {
	allocated := claim.Status.Allocation.Devices.Config
	if len(claim.Spec.Devices.Config) == 0 {
		return allocated
	}
	var out []resourceapi.DeviceAllocationConfiguration
	for _, c := range allocated {
		if c.Source != resourceapi.AllocationConfigSourceClaim {
			out = append(out, c)
		}
	}
	for _, c := range claim.Spec.Devices.Config {
		out = append(out, resourceapi.DeviceAllocationConfiguration{
			Source:              resourceapi.AllocationConfigSourceClaim,
			Requests:            c.Requests,
			DeviceConfiguration: c.DeviceConfiguration,
		})
	}
	return out
}

// unfitting returns an error for each config for all requests that fits
// none of devices: written for the claim's devices, it would configure
// none of them. (A config that fits some device kind of the claim and
// loses to a later config is overridden, not ignored.)
func unfitting(candidates []candidate, devices []Device) []error {
	if len(devices) == 0 {
		return nil
	}
	var errs []error
	for _, c := range candidates {
		if len(c.origin.Requests) > 0 || slices.ContainsFunc(devices, func(d Device) bool { return fits(c.config, d.Kind) }) {
			continue
		}
		var got, want []string
		for _, d := range devices {
			got = append(got, fmt.Sprintf("%q (request %q) is %s", d.Result.Device, d.Result.Request, deviceKindName[d.Kind]))
			if !slices.Contains(want, configKind[d.Kind]) {
				want = append(want, configKind[d.Kind])
			}
		}
		errs = append(errs, &ConfigError{Origin: c.origin, Err: fmt.Errorf(
			"a %s configures %s only, and this claim has none: device %s; use a %s",
			c.config.GetObjectKind().GroupVersionKind().Kind, pluralKindName[kindConfigured(c.config)],
			strings.Join(got, ", device "), strings.Join(want, " or a "))})
	}
	return errs
}

// decodeConfigs returns the configs of driver, class configs first, each
// decoded, normalized and validated.
func decodeConfigs(driver string, configs []resourceapi.DeviceAllocationConfiguration, features v1beta1.Features) ([]candidate, []error) {
	var class, claim []candidate
	var errs []error
	indexes := make(map[resourceapi.AllocationConfigSource]int)
	for _, c := range configs {
		origin := Origin{Source: c.Source, Index: indexes[c.Source], Requests: c.Requests}
		indexes[c.Source]++
		if c.Opaque == nil {
			// A kind of configuration newer than this driver; whose it is
			// cannot be told, so it cannot be skipped safely.
			errs = append(errs, &ConfigError{Origin: origin, Err: errors.New("only opaque parameters are supported")})
			continue
		}
		if c.Opaque.Driver != driver {
			continue
		}
		if c.Source != resourceapi.AllocationConfigSourceClass && c.Source != resourceapi.AllocationConfigSourceClaim {
			errs = append(errs, &ConfigError{Origin: origin, Err: fmt.Errorf("unknown config source %q", c.Source)})
			continue
		}
		raw, err := parametersJSON(c.Opaque.Parameters)
		var config v1beta1.Config
		if err == nil {
			config, err = DecodeParameters(raw, features)
		}
		if err != nil {
			errs = append(errs, &ConfigError{Origin: origin, Err: err})
			continue
		}
		if c.Source == resourceapi.AllocationConfigSourceClass {
			class = append(class, candidate{origin: origin, config: config})
		} else {
			claim = append(claim, candidate{origin: origin, config: config})
		}
	}
	return append(class, claim...), errs
}

// choose returns the candidate that configures result, nil for the default,
// or a *ConfigError when the winner does not fit the device.
func choose(candidates []candidate, result resourceapi.DeviceRequestAllocationResult, kind DeviceKind) (*candidate, error) {
	for i := len(candidates) - 1; i >= 0; i-- {
		c := &candidates[i]
		if len(c.origin.Requests) == 0 {
			if fits(c.config, kind) {
				return c, nil
			}
			continue
		}
		if !names(c.origin.Requests, result.Request) {
			continue
		}
		if !fits(c.config, kind) {
			return nil, &ConfigError{Origin: c.origin, Err: fmt.Errorf(
				"a %s cannot configure device %q (request %q), which is %s; use a %s",
				c.config.GetObjectKind().GroupVersionKind().Kind, result.Device, result.Request, deviceKindName[kind], configKind[kind])}
		}
		return c, nil
	}
	return nil, nil
}

// names reports whether a config's request list names request, which is
// "req" or, for a subrequest, "req/sub".
func names(requests []string, request string) bool {
	parent, _, _ := strings.Cut(request, "/")
	return slices.Contains(requests, request) || slices.Contains(requests, parent)
}

// Groups groups devices by the config they got, in the order of each
// config's first device. Devices with the built-in default form one group
// per device kind.
func Groups(devices []Device) []Group {
	var groups []Group
	index := make(map[v1beta1.Config]int)
	for _, d := range devices {
		i, ok := index[d.Config]
		if !ok {
			i = len(groups)
			index[d.Config] = i
			groups = append(groups, Group{Origin: d.Origin, Config: d.Config})
		}
		groups[i].Devices = append(groups[i].Devices, d)
	}
	return groups
}

// errorList is several errors reported together. It reads like a Kubernetes
// aggregate error and unwraps to its members, so errors.As finds a
// *ConfigError in it.
type errorList []error

// Error implements error.
func (l errorList) Error() string {
	if len(l) == 1 {
		return l[0].Error()
	}
	msgs := make([]string, len(l))
	for i, err := range l {
		msgs[i] = err.Error()
	}
	return "[" + strings.Join(msgs, ", ") + "]"
}

// Unwrap returns the members of l.
func (l errorList) Unwrap() []error { return l }
