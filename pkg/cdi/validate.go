package cdi

import (
	"errors"
	"fmt"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// validate refuses a spec that the CDI library would refuse to write
// (Cache.WriteSpec, v1.1.1), and so that no runtime could load, with the
// library's own checks where it exports them: the version against the
// features the spec uses, the vendor, class and device names, and every
// container edit (environment, device nodes, mounts, hooks). What it
// checks without exporting is what the CDI specification states: a spec
// has at least one device, device names are unique, and every device has
// an edit. (Its annotation check does nothing for specs-go's
// map[string]string annotations.) TestValidateAgreesWithTheLibrary and
// FuzzValidateAgreesWithTheLibrary hold the two to the same answer.
func validate(spec *cdispec.Spec) error {
	if err := cdispec.ValidateVersion(spec); err != nil {
		return err
	}
	vendor, class := parser.ParseQualifier(spec.Kind)
	if err := parser.ValidateVendorName(vendor); err != nil {
		return fmt.Errorf("kind %q: %w", spec.Kind, err)
	}
	if err := parser.ValidateClassName(class); err != nil {
		return fmt.Errorf("kind %q: %w", spec.Kind, err)
	}
	if err := (&cdiapi.ContainerEdits{ContainerEdits: &spec.ContainerEdits}).Validate(); err != nil {
		return err
	}
	if len(spec.Devices) == 0 {
		return errors.New("no devices")
	}
	for i := range spec.Devices {
		d := &spec.Devices[i]
		if err := parser.ValidateDeviceName(d.Name); err != nil {
			return err
		}
		// A claim's spec has a device or a few: a scan costs less than a
		// map.
		for _, e := range spec.Devices[:i] {
			if e.Name == d.Name {
				return fmt.Errorf("device %q defined twice", d.Name)
			}
		}
		if noEdits(&d.ContainerEdits) {
			return fmt.Errorf("device %q: no container edits", d.Name)
		}
		if err := (&cdiapi.ContainerEdits{ContainerEdits: &d.ContainerEdits}).Validate(); err != nil {
			return fmt.Errorf("device %q: %w", d.Name, err)
		}
	}
	return nil
}

// noEdits reports whether e edits nothing in a container.
func noEdits(e *cdispec.ContainerEdits) bool {
	return len(e.Env) == 0 && len(e.DeviceNodes) == 0 && len(e.Hooks) == 0 && len(e.Mounts) == 0 &&
		len(e.AdditionalGIDs) == 0 && e.IntelRdt == nil && len(e.NetDevices) == 0
}
