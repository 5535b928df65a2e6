package mps

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/mps"
)

// Device metadata attributes (KEP-5304) of a device an MPS daemon serves:
// the daemon, for logs and support, and where the container finds its
// pipe (CUDA_MPS_PIPE_DIRECTORY), for tools that do not inherit the
// environment.
const (
	AttrMPSDaemonID      = "mpsDaemonID"
	AttrMPSPipeDirectory = "mpsPipeDirectory"
)

// Metadata implements [preparer.FeatureMetadata].
func (c *Configurator) Metadata(rec *Record, device string) map[string]resourceapi.DeviceAttribute {
	for _, dm := range rec.Daemons {
		if slices.Contains(dm.Devices, device) {
			return map[string]resourceapi.DeviceAttribute{
				AttrMPSDaemonID:      {StringValue: ptr.To(dm.ID)},
				AttrMPSPipeDirectory: {StringValue: ptr.To(mps.ContainerPipeDir)},
			}
		}
	}
	return nil
}
