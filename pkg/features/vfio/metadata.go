package vfio

import (
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/devicemodel"
)

// AttrVFIODevicePaths is the device metadata attribute (KEP-5304) of a
// passed-through GPU: its VFIO device nodes in the container, separated by
// commas (an attribute holds no list), which a VMM is pointed at.
const AttrVFIODevicePaths = "vfioDevicePaths"

// Metadata implements [preparer.FeatureMetadata]: the IOMMU group bound
// and the device nodes, from the record, so that they are the group and
// the nodes the claim holds, not what sysfs says at a later Prepare.
func (c *Configurator) Metadata(rec *Record, device string) map[string]resourceapi.DeviceAttribute {
	for _, p := range rec.Devices {
		if p.Device != device {
			continue
		}
		attrs := map[string]resourceapi.DeviceAttribute{
			string(devicemodel.AttrIOMMUGroup): {IntValue: ptr.To(int64(p.IOMMUGroup))},
		}
		if len(p.DevicePaths) > 0 {
			attrs[AttrVFIODevicePaths] = resourceapi.DeviceAttribute{StringValue: ptr.To(strings.Join(p.DevicePaths, ","))}
		}
		return attrs
	}
	return nil
}
