package webhook

import (
	"encoding/json"
	"fmt"
	"regexp"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gpudra/gpudra/deployments/deviceclasses"
	"github.com/gpudra/gpudra/pkg/claimconfig"
)

// deviceTypeSelector finds the device type a DeviceClass's CEL selector
// requires of the GPU driver's devices.
var deviceTypeSelector = regexp.MustCompile(`\.type == '(gpu|mig|vfio)'`)

// classKinds maps each DeviceClass gpudra ships (deployments/deviceclasses,
// which the Helm chart installs under the same names) to the kind of
// device it selects. The webhook reads no DeviceClass from the API server:
// a claim that names a class of its own is left to Prepare.
var classKinds = func() map[string]claimconfig.DeviceKind {
	classes, err := deviceclasses.All()
	if err != nil {
		panic(err) // the embedded files are tested
	}
	kinds := map[string]claimconfig.DeviceKind{}
	for _, c := range classes {
		var found []string
		for _, s := range c.Spec.Selectors {
			if s.CEL != nil {
				for _, m := range deviceTypeSelector.FindAllStringSubmatch(s.CEL.Expression, -1) {
					found = append(found, m[1])
				}
			}
		}
		if len(found) == 1 {
			kinds[c.Name] = claimconfig.DeviceKind(found[0])
		}
	}
	return kinds
}()

// classKind implements [claimconfig.ClassKindFunc] for gpudra's classes.
func classKind(className string) (claimconfig.DeviceKind, bool) {
	k, ok := classKinds[className]
	return k, ok
}

// claimSpecs decodes the claim spec of a ResourceClaim or a
// ResourceClaimTemplate, nil for other kinds.
var claimSpecs = map[string]func(raw []byte) (*resourceapi.ResourceClaimSpec, error){
	"ResourceClaim": func(raw []byte) (*resourceapi.ResourceClaimSpec, error) {
		var obj resourceapi.ResourceClaim
		err := json.Unmarshal(raw, &obj)
		return &obj.Spec, err
	},
	"ResourceClaimTemplate": func(raw []byte) (*resourceapi.ResourceClaimSpec, error) {
		var obj resourceapi.ResourceClaimTemplate
		err := json.Unmarshal(raw, &obj)
		return &obj.Spec.Spec, err
	},
}

// validateFit refuses the GPU driver's configs that cannot fit the devices
// their requests' DeviceClasses select ([claimconfig.CheckFit]): a
// MigDeviceConfig for a request of class gpu.nvidia.com is refused here
// rather than at Prepare.
func (v *validator) validateFit(path *field.Path, spec *resourceapi.ResourceClaimSpec) []fieldError {
	driver := v.nameOf[GPUDriver]
	if driver == "" {
		return nil
	}
	var errs []fieldError
	for _, ce := range claimconfig.CheckFit(driver, spec, classKind, claimconfig.ValidationFeatures) {
		p := path.Index(ce.Origin.Index)
		if len(ce.Origin.Requests) > 0 {
			p = p.Child("requests")
		} else {
			p = p.Child("opaque", "parameters")
		}
		errs = append(errs, fieldError{p, fmt.Errorf("%w", ce.Err)})
	}
	return errs
}
