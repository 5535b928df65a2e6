package preparer

import (
	"context"
	"encoding/json"
	"maps"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
)

// Describer is implemented by configurators that set up something a
// container may want to read at run time (KEP-5304 device metadata): the
// MIG device they created, the IOMMU group they bound. Metadata returns
// the attributes of the named device of a claim whose completed record is
// rec, or nil when the record says nothing of it. It must derive them from
// the record alone: a Prepare answered from the checkpoint (after a
// kubelet restart) must give the same metadata as the first.
type Describer interface {
	Metadata(rec json.RawMessage, device string) (map[string]resourceapi.DeviceAttribute, error)
}

// FeatureMetadata is [Describer] for a [Feature] with record R.
type FeatureMetadata[R any] interface {
	Metadata(rec *R, device string) map[string]resourceapi.DeviceAttribute
}

// Metadata implements [Describer].
func (a *Adapter[R]) Metadata(raw json.RawMessage, device string) (map[string]resourceapi.DeviceAttribute, error) {
	m, ok := a.feature.(FeatureMetadata[R])
	if !ok {
		return nil, nil
	}
	rec, err := a.codec.Decode(raw)
	if err != nil {
		return nil, err
	}
	return m.Metadata(rec, device), nil
}

// deviceMetadata is what a container learns of one prepared device: the
// attributes it is published with, the hardware identity the record holds
// (the UUID of a MIG device created at Prepare, which no slice carries),
// and what each configurator set up for it. Later sources win, so a
// record's word beats a published attribute that predates the Prepare.
//
// Everything comes from the completed record and the published devices,
// never from what exists only during the first Prepare, so that a repeated
// Prepare answered from the checkpoint writes the same file.
func (p *Preparer) deviceMetadata(ctx context.Context, model *devicemodel.Model, rec *claimstate.Claim, d claimstate.Device) *kubeletplugin.DeviceMetadata {
	attrs := map[string]resourceapi.DeviceAttribute{}
	if dev, ok := lookup(model, d.Name); ok {
		for k, v := range dev.API.Attributes {
			attrs[string(k)] = v
		}
	} else {
		// A prepared device that is not published now (an unhealthy GPU
		// withdrawn where the API server has no device taints): its file
		// says what the record knows, and a Prepare once it is published
		// again writes the published attributes again.
		klog.FromContext(ctx).Info("Device metadata without the published attributes: the device is not published now", "device", d.Name)
	}
	if d.UUID != "" {
		attrs[string(devicemodel.AttrUUID)] = resourceapi.DeviceAttribute{StringValue: &d.UUID}
	}
	if d.ParentUUID != "" {
		attrs[string(devicemodel.AttrParentUUID)] = resourceapi.DeviceAttribute{StringValue: &d.ParentUUID}
	}
	for _, conf := range p.cfg.Configurators {
		desc, ok := conf.(Describer)
		raw := rec.Records[conf.Name()]
		if !ok || raw == nil {
			continue
		}
		extra, err := desc.Metadata(raw, d.Name)
		if err != nil {
			// The claim is prepared; metadata serves the workload's own
			// discovery and must not fail its Prepare.
			klog.FromContext(ctx).Error(err, "Device metadata leaves out what a configurator set up", "configurator", conf.Name(), "device", d.Name)
			continue
		}
		maps.Copy(attrs, extra)
	}
	return &kubeletplugin.DeviceMetadata{Attributes: attrs}
}

// kubeletDevicesOf are the devices the kubelet gets for a prepared claim,
// with their metadata when the preparer fills it in.
func (p *Preparer) kubeletDevicesOf(ctx context.Context, rec *claimstate.Claim) []kubeletplugin.Device {
	out := kubeletDevices(rec.Devices)
	if !p.cfg.DeviceMetadata {
		return out
	}
	model := p.cfg.Node.Model()
	for i := range out {
		out[i].Metadata = p.deviceMetadata(ctx, model, rec, rec.Devices[i])
	}
	return out
}

func lookup(model *devicemodel.Model, name string) (*devicemodel.Device, bool) {
	if model == nil {
		return nil, false
	}
	return model.Lookup(name)
}
