package timeslicing

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"
)

// AttrTimeSliceInterval is the device metadata attribute (KEP-5304) of a
// time-sliced GPU: the interval the claim asked for and holds (Default,
// Short, Medium, Long), so that a workload can see how it is scheduled.
const AttrTimeSliceInterval = "timeSliceInterval"

// Metadata implements [preparer.FeatureMetadata].
func (c *Configurator) Metadata(rec *Record, device string) map[string]resourceapi.DeviceAttribute {
	for _, h := range rec.GPUs {
		if h.Device == device {
			return map[string]resourceapi.DeviceAttribute{AttrTimeSliceInterval: {StringValue: ptr.To(string(h.Interval))}}
		}
	}
	return nil
}
