package dynamicmig

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/devicemodel"
)

// Device metadata attributes (KEP-5304) of a MIG device created at
// Prepare, besides the published ones: where it was created and the
// instance IDs, which a workload needs to address the instance (nvidia-smi
// -i <parent> -gi <gi> -ci <ci>) and which no slice can carry.
const (
	AttrPlacementStart    = "placementStart"
	AttrPlacementSize     = "placementSize"
	AttrGPUInstanceID     = "gpuInstanceID"
	AttrComputeInstanceID = "computeInstanceID"
)

// Metadata implements [preparer.FeatureMetadata]: the instance the record
// says was created for device; nil for a device it did not create.
func (c *Configurator) Metadata(rec *Record, device string) map[string]resourceapi.DeviceAttribute {
	for _, in := range rec.Devices {
		if in.Device != device {
			continue
		}
		attrs := map[string]resourceapi.DeviceAttribute{
			string(devicemodel.AttrProfile):    {StringValue: ptr.To(in.Profile)},
			string(devicemodel.AttrParentUUID): {StringValue: ptr.To(in.ParentUUID)},
			AttrPlacementStart:                 {IntValue: ptr.To(int64(in.Start))},
			AttrPlacementSize:                  {IntValue: ptr.To(int64(in.Size))},
		}
		if in.UUID != "" {
			// Created: the IDs are the instance's (GI and CI 0 are valid).
			attrs[string(devicemodel.AttrUUID)] = resourceapi.DeviceAttribute{StringValue: ptr.To(in.UUID)}
			attrs[AttrGPUInstanceID] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(in.GIID))}
			attrs[AttrComputeInstanceID] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(in.CIID))}
		}
		return attrs
	}
	return nil
}
