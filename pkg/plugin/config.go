package plugin

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/config"
)

// configFeatures is what the opaque configs are validated against: every
// value the API defines is checked, so a typo is reported as such, before
// planSharing says which settings this node can carry out.
var configFeatures = v1beta1.Features{TimeSlicingSettings: true, MPSSupport: true}

// resolveConfigs resolves the claim's opaque configs for this driver's
// devices, in the order of the intent's devices.
func (d *Driver) resolveConfigs(claim *resourceapi.ResourceClaim, node *nodeState) ([]config.Device, error) {
	kindOf := func(r resourceapi.DeviceRequestAllocationResult) (config.DeviceKind, error) {
		dev, ok := node.model.Lookup(r.Device)
		if !ok {
			return "", fmt.Errorf("device %s is not a device of this node", r.Device)
		}
		return configKind(dev), nil
	}
	return config.Resolve(d.cfg.DriverName, claim, kindOf, configFeatures)
}
