package imexchannel

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"
)

// Device metadata attributes (KEP-5304) of a channel claim's devices: the
// ComputeDomain the channel belongs to and the channel's number on this
// node (/dev/nvidia-caps-imex-channels/channel<N>); allChannels is set
// when the claim got every channel.
const (
	AttrDomainID    = "domainID"
	AttrChannel     = "channel"
	AttrAllChannels = "allChannels"
)

// Metadata implements [preparer.FeatureMetadata]. A channel record is the
// claim's, not one device's: every device of the claim gets it.
func (c *Configurator) Metadata(rec *Record, _ string) map[string]resourceapi.DeviceAttribute {
	attrs := map[string]resourceapi.DeviceAttribute{
		AttrDomainID: {StringValue: ptr.To(rec.Domain)},
		AttrChannel:  {IntValue: ptr.To(int64(rec.Channel))},
	}
	if rec.All {
		attrs[AttrAllChannels] = resourceapi.DeviceAttribute{BoolValue: ptr.To(true)}
	}
	return attrs
}
