// Package claimconfig resolves the effective opaque configuration of every device
// a ResourceClaim was allocated from this driver. It is pure: the kubelet
// plugin calls Resolve on the claims it prepares, and the webhook calls
// ValidateOpaque on the configs of the claims it admits, so both accept and
// reject exactly the same parameters.
//
// # Precedence
//
// The configs of a claim's allocation are considered in this order, lowest
// precedence first, as in the NVIDIA DRA driver: the built-in default of the
// device kind (exclusive use), then every config from the device classes in
// their order, then every config from the claim in their order. Of the configs
// that apply to a device, the last one wins as a whole; configs are never
// merged field by field.
//
// A config applies to an allocated device when the config's request list is
// empty or names the device's request. A device allocated for the subrequest
// "req/sub" is named by both "req" and "req/sub", as the resource.k8s.io API
// defines (the NVIDIA driver only matches "req/sub").
//
// Each kind of config fits one kind of device: a GpuConfig a full GPU, a
// MigDeviceConfig a MIG device. A config with an empty request list only
// applies to devices it fits, so one GpuConfig and one MigDeviceConfig can
// both address all requests; but it must fit at least one device of the
// claim, or it is an error rather than a config ignored. A config that names
// a request must fit the device it would configure; if it wins for a device
// it does not fit, that is an error. Configs of other drivers are ignored.
//
// The claim's own configs are taken from its spec, with the request lists
// the user wrote: the allocator empties the request list of a config that
// names every request of the claim.
//
// Every config of this driver is decoded strictly, normalized and validated,
// even one that a later config overrides, so that a claim the webhook admits is
// a claim the plugin can prepare and the other way round.
package claimconfig

import (
	"encoding/json"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

// DeviceKind is what kind of device an allocation result refers to, which
// decides the kind of config it takes.
type DeviceKind string

const (
	// GPU is a full GPU, configured by a v1beta1.GpuConfig.
	GPU DeviceKind = "gpu"
	// MIG is a MIG device, configured by a v1beta1.MigDeviceConfig.
	MIG DeviceKind = "mig"
	// VFIO is a GPU passed through with VFIO, configured by a
	// v1beta1.VfioDeviceConfig.
	VFIO DeviceKind = "vfio"
	// Channel is an IMEX channel of driver compute-domain.nvidia.com,
	// configured by a v1beta1.ComputeDomainChannelConfig.
	Channel DeviceKind = "channel"
	// Daemon is the IMEX daemon device of driver compute-domain.nvidia.com,
	// configured by a v1beta1.ComputeDomainDaemonConfig.
	Daemon DeviceKind = "daemon"
)

// configKind is the config kind each device kind takes.
var configKind = map[DeviceKind]string{
	GPU:     v1beta1.GpuConfigKind,
	MIG:     v1beta1.MigDeviceConfigKind,
	VFIO:    v1beta1.VfioDeviceConfigKind,
	Channel: v1beta1.ComputeDomainChannelConfigKind,
	Daemon:  v1beta1.ComputeDomainDaemonConfigKind,
}

// deviceKindName names a device kind in messages.
var deviceKindName = map[DeviceKind]string{
	GPU:     "a full GPU",
	MIG:     "a MIG device",
	VFIO:    "a VFIO passthrough GPU",
	Channel: "an IMEX channel",
	Daemon:  "an IMEX daemon device",
}

// pluralKindName names the devices of a kind in messages.
var pluralKindName = map[DeviceKind]string{
	GPU:     "full GPUs",
	MIG:     "MIG devices",
	VFIO:    "VFIO passthrough GPUs",
	Channel: "IMEX channels",
	Daemon:  "IMEX daemon devices",
}

// kindConfigured returns the kind of device config configures; "" for none.
func kindConfigured(config v1beta1.Config) DeviceKind {
	switch config.(type) {
	case *v1beta1.GpuConfig:
		return GPU
	case *v1beta1.MigDeviceConfig:
		return MIG
	case *v1beta1.VfioDeviceConfig:
		return VFIO
	case *v1beta1.ComputeDomainChannelConfig:
		return Channel
	case *v1beta1.ComputeDomainDaemonConfig:
		return Daemon
	}
	return ""
}

// fits reports whether config can configure a device of kind.
func fits(config v1beta1.Config, kind DeviceKind) bool {
	return kindConfigured(config) == kind
}

// defaultConfig returns the config of a device that no config applies to.
func defaultConfig(kind DeviceKind) v1beta1.Config {
	switch kind {
	case GPU:
		return v1beta1.DefaultGpuConfig()
	case MIG:
		return v1beta1.DefaultMigDeviceConfig()
	case VFIO:
		return v1beta1.DefaultVfioDeviceConfig()
	case Channel:
		return v1beta1.DefaultComputeDomainChannelConfig()
	case Daemon:
		return v1beta1.DefaultComputeDomainDaemonConfig()
	}
	return nil
}

// Origin identifies the config a device got.
type Origin struct {
	// Source is FromClass or FromClaim; empty for the built-in default.
	Source resourceapi.AllocationConfigSource
	// Index counts the configs of the same source in the claim's allocation,
	// those of other drivers included, from 0; for a claim config it is its
	// index in spec.devices.config. It is -1 for the built-in default.
	Index int
	// Requests is the config's request list; empty means all requests.
	Requests []string
}

// IsDefault reports whether o is the built-in default.
func (o Origin) IsDefault() bool { return o.Source == "" }

// String names the config for messages, e.g. `claim config #1 (requests
// [gpu])`, `class config #0 (all requests)` or `default config`.
func (o Origin) String() string {
	var source string
	switch o.Source {
	case "":
		return "default config"
	case resourceapi.AllocationConfigSourceClass:
		source = "class"
	case resourceapi.AllocationConfigSourceClaim:
		source = "claim"
	default:
		source = fmt.Sprintf("%q", o.Source)
	}
	requests := "all requests"
	if len(o.Requests) > 0 {
		requests = "requests [" + strings.Join(o.Requests, " ") + "]"
	}
	return fmt.Sprintf("%s config #%d (%s)", source, o.Index, requests)
}

// ConfigError is a problem with one opaque config of a claim: it cannot be
// decoded, it is invalid, or it does not fit a device it applies to. Only a
// change of the claim (or its device class) fixes it; retrying does not.
type ConfigError struct {
	// Origin is the config at fault.
	Origin Origin
	// Err says what is wrong, naming the field path where there is one.
	Err error
}

// Error implements error.
func (e *ConfigError) Error() string { return e.Origin.String() + ": " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *ConfigError) Unwrap() error { return e.Err }

// ValidationFeatures is what the kubelet plugin and the webhook validate
// opaque configs against: every value the API defines is checked, so a typo
// is reported as such, before the plugin's configurators say which settings
// its node can carry out. One value for both keeps their messages the same.
var ValidationFeatures = v1beta1.Features{TimeSlicingSettings: true, MPSSupport: true}

// DecodeParameters decodes one opaque parameters document of this driver
// strictly, normalizes it and validates it against features.
func DecodeParameters(raw []byte, features v1beta1.Features) (v1beta1.Config, error) {
	obj, err := v1beta1.Decode(raw)
	if err != nil {
		return nil, err
	}
	config, ok := obj.(v1beta1.Config)
	if !ok {
		return nil, fmt.Errorf("kind %s does not configure devices", obj.GetObjectKind().GroupVersionKind().Kind)
	}
	config.Normalize()
	if err := config.Validate(features); err != nil {
		return nil, err
	}
	return config, nil
}

// ValidateOpaque validates the opaque parameters of one device config the
// way Resolve does, for the admission webhook. It returns nil for a config
// of another driver than driver.
func ValidateOpaque(driver string, opaque *resourceapi.OpaqueDeviceConfiguration, features v1beta1.Features) error {
	if opaque == nil || opaque.Driver != driver {
		return nil
	}
	raw, err := parametersJSON(opaque.Parameters)
	if err != nil {
		return err
	}
	_, err = DecodeParameters(raw, features)
	return err
}

// parametersJSON returns the JSON of opaque parameters. Parameters read from
// the API server are always raw JSON; an object is marshalled, for callers
// that build claims in process.
func parametersJSON(p runtime.RawExtension) ([]byte, error) {
	if p.Raw != nil || p.Object == nil {
		return p.Raw, nil
	}
	raw, err := json.Marshal(p.Object)
	if err != nil {
		return nil, fmt.Errorf("encode parameters object: %w", err)
	}
	return raw, nil
}
