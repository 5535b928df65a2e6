package webhook

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/claimconfig"
)

// Driver is one of gpudra's DRA drivers, whatever name it is deployed
// under.
type Driver string

const (
	// GPUDriver serves GPUs, MIG devices and VFIO passthrough
	// (gpu.nvidia.com by default).
	GPUDriver Driver = "gpu"
	// ComputeDomainDriver serves ComputeDomain channels and daemons
	// (compute-domain.nvidia.com by default).
	ComputeDomainDriver Driver = "compute-domain"
)

// kindsOf lists the opaque config kinds each driver takes. A kind added to
// the config API (api/resource/v1beta1) is validated by the webhook once it
// is listed here: one line.
// A driver without kinds would have its configs checked only for a kind of
// another driver, the rest left to its plugin.
var kindsOf = map[Driver][]string{
	GPUDriver:           {v1beta1.GpuConfigKind, v1beta1.MigDeviceConfigKind, v1beta1.VfioDeviceConfigKind},
	ComputeDomainDriver: {v1beta1.ComputeDomainChannelConfigKind, v1beta1.ComputeDomainDaemonConfigKind},
}

// ownerOf returns the driver that takes config kind, if any.
func ownerOf(kind string) (Driver, bool) {
	for d, kinds := range kindsOf {
		if slices.Contains(kinds, kind) {
			return d, true
		}
	}
	return "", false
}

// validator validates the opaque configs of the drivers it knows by name.
type validator struct {
	// names maps each driver name validated to its driver.
	names map[string]Driver
	// nameOf maps each driver to its name, for messages.
	nameOf map[Driver]string
}

// validateParameters validates the parameters of one opaque config of the
// driver called name. The GPU driver's parameters go through
// [claimconfig.DecodeParameters] with [claimconfig.ValidationFeatures], exactly as
// the kubelet plugin decodes them at Prepare, so its error is returned
// unchanged.
func (v *validator) validateParameters(d Driver, name string, raw []byte) error {
	kind := kindOf(raw)
	if owner, ok := ownerOf(kind); ok && owner != d {
		return fmt.Errorf("kind %s configures devices of driver %s, not %s", kind, v.driverName(owner), name)
	}
	if len(kindsOf[d]) == 0 {
		return nil
	}
	cfg, err := claimconfig.DecodeParameters(raw, claimconfig.ValidationFeatures)
	if err != nil {
		return err
	}
	// A kind of the API that is not registered for d: only reachable once
	// the API has a kind kindsOf does not list.
	if got := cfg.GetObjectKind().GroupVersionKind().Kind; !slices.Contains(kindsOf[d], got) {
		return fmt.Errorf("kind %s is not a config of driver %s; supported kinds: %s", got, name, strings.Join(kindsOf[d], ", "))
	}
	return nil
}

// driverName names d in messages: its configured name, else its default.
func (v *validator) driverName(d Driver) string {
	if name := v.nameOf[d]; name != "" {
		return name
	}
	return defaultNames[d]
}

// kindOf returns the kind a parameters document names, "" when it names
// none or is not a JSON object. Decoding proper reports such documents.
func kindOf(raw []byte) string {
	var meta struct {
		Kind string `json:"kind"`
	}
	if json.Unmarshal(raw, &meta) != nil {
		return ""
	}
	return meta.Kind
}

// fieldError is one refused config: the path of its parameters in the
// object and the plugin's message.
type fieldError struct {
	path *field.Path
	err  error
}

// String gives the path and the message, e.g.
// `spec.devices.config[0].opaque.parameters: unknown field "sharing.strategyy"`.
func (e fieldError) String() string { return e.path.String() + ": " + e.err.Error() }

// validateConfigs validates every opaque config of one of the drivers in
// configs, which sit at path (a list of DeviceConfiguration). Configs of
// other drivers are ignored.
func (v *validator) validateConfigs(path *field.Path, configs []resourceapi.DeviceConfiguration) []fieldError {
	var errs []fieldError
	for i, c := range configs {
		if c.Opaque == nil {
			continue // the API server requires opaque; nothing else exists yet.
		}
		d, ours := v.names[c.Opaque.Driver]
		if !ours {
			continue
		}
		raw := c.Opaque.Parameters.Raw
		if raw == nil && c.Opaque.Parameters.Object != nil {
			var err error
			if raw, err = json.Marshal(c.Opaque.Parameters.Object); err != nil {
				errs = append(errs, fieldError{path.Index(i).Child("opaque", "parameters"), err})
				continue
			}
		}
		if err := v.validateParameters(d, c.Opaque.Driver, raw); err != nil {
			errs = append(errs, fieldError{path.Index(i).Child("opaque", "parameters"), err})
		}
	}
	return errs
}

// claimConfigs returns a claim spec's configs as DeviceConfigurations.
func claimConfigs(spec *resourceapi.ResourceClaimSpec) []resourceapi.DeviceConfiguration {
	out := make([]resourceapi.DeviceConfiguration, len(spec.Devices.Config))
	for i, c := range spec.Devices.Config {
		out[i] = c.DeviceConfiguration
	}
	return out
}

// classConfigs returns a class spec's configs as DeviceConfigurations.
func classConfigs(spec *resourceapi.DeviceClassSpec) []resourceapi.DeviceConfiguration {
	out := make([]resourceapi.DeviceConfiguration, len(spec.Config))
	for i, c := range spec.Config {
		out[i] = c.DeviceConfiguration
	}
	return out
}
