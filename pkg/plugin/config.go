package plugin

import (
	"errors"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/config"
	"github.com/gpudra/gpudra/pkg/devicemodel"
)

// configFeatures is what the opaque configs are validated against: every
// value the API defines is checked, so a typo is reported as such, before
// checkConfigs says which settings this version can carry out.
var configFeatures = v1beta1.Features{TimeSlicingSettings: true, MPSSupport: true}

// errSharingNotSupported is returned for any sharing setting until GPU
// sharing is implemented; silently giving a pod an exclusive GPU it asked
// to share (or the reverse) would be worse than refusing.
var errSharingNotSupported = errors.New("GPU sharing (time-slicing, MPS) is not supported yet by gpudra; remove the sharing setting to get the device exclusively")

// checkConfigs resolves the claim's opaque configs for this driver's
// devices and refuses what gpudra cannot carry out yet.
func (d *Driver) checkConfigs(claim *resourceapi.ResourceClaim, node *nodeState) error {
	kindOf := func(r resourceapi.DeviceRequestAllocationResult) (config.DeviceKind, error) {
		dev, ok := node.model.Lookup(r.Device)
		if !ok {
			return "", fmt.Errorf("device %s is not a device of this node", r.Device)
		}
		if dev.Kind == devicemodel.KindMIG {
			return config.MIG, nil
		}
		return config.GPU, nil
	}
	resolved, err := config.Resolve(d.cfg.DriverName, claim, kindOf, configFeatures)
	if err != nil {
		return err
	}
	for _, dev := range resolved {
		if sharingOf(dev.Config) != nil {
			return fmt.Errorf("device %s: %s: %w", dev.Result.Device, dev.Origin, errSharingNotSupported)
		}
	}
	return nil
}

// sharingOf returns the sharing setting of a resolved config, or nil.
func sharingOf(c v1beta1.Config) any {
	switch c := c.(type) {
	case *v1beta1.GpuConfig:
		if c.Sharing != nil {
			return c.Sharing
		}
	case *v1beta1.MigDeviceConfig:
		if c.Sharing != nil {
			return c.Sharing
		}
	}
	return nil
}
