package claimconfig

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

// TestResolveComputeDomain resolves claims of driver
// compute-domain.nvidia.com, as the channel plugin does.
func TestResolveComputeDomain(t *testing.T) {
	const cdDriver = "compute-domain.nvidia.com"
	cdKind := func(r resourceapi.DeviceRequestAllocationResult) (DeviceKind, error) {
		if strings.HasPrefix(r.Device, "daemon-") {
			return Daemon, nil
		}
		return Channel, nil
	}
	opaque := func(doc string) resourceapi.DeviceAllocationConfiguration {
		return resourceapi.DeviceAllocationConfiguration{Source: resourceapi.AllocationConfigSourceClaim,
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: cdDriver, Parameters: runtime.RawExtension{Raw: []byte(doc)}}}}
	}
	res := func(device string) resourceapi.DeviceRequestAllocationResult {
		return resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: cdDriver, Pool: "n", Device: device}
	}
	const channelAll = `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig", "domainID": "d1", "allocationMode": "All"}`
	const daemon = `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainDaemonConfig", "domainID": "d1"}`

	devices, err := Resolve(cdDriver, newClaim([]resourceapi.DeviceAllocationConfiguration{opaque(channelAll)}, res("channel-0")), cdKind, v1beta1.Features{})
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	c, ok := devices[0].Config.(*v1beta1.ComputeDomainChannelConfig)
	if !ok || c.DomainID != "d1" || c.AllocationMode != v1beta1.ChannelAllocationModeAll || devices[0].Kind != Channel {
		t.Errorf("channel resolved to %+v", devices[0])
	}

	devices, err = Resolve(cdDriver, newClaim(nil, res("channel-0")), cdKind, v1beta1.Features{})
	if err != nil {
		t.Fatalf("Resolve without config: %v", err)
	}
	if c := devices[0].Config.(*v1beta1.ComputeDomainChannelConfig); c.DomainID != "" || !devices[0].Origin.IsDefault() {
		t.Errorf("channel without config resolved to %+v", devices[0])
	}

	_, err = Resolve(cdDriver, newClaim([]resourceapi.DeviceAllocationConfiguration{opaque(daemon)}, res("channel-0")), cdKind, v1beta1.Features{})
	want := `claim config #0 (all requests): a ComputeDomainDaemonConfig configures IMEX daemon devices only, and this claim has none: device "channel-0" (request "r") is an IMEX channel; use a ComputeDomainChannelConfig`
	if err == nil || err.Error() != want {
		t.Errorf("daemon config on a channel: %v\nwant %s", err, want)
	}

	bad := `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig", "domainID": "d1", "allocationMode": "Some"}`
	err = ValidateOpaque(cdDriver, opaque(bad).Opaque, v1beta1.Features{})
	if err == nil || !strings.Contains(err.Error(), `allocationMode: Unsupported value: "Some"`) {
		t.Errorf("ValidateOpaque = %v", err)
	}
}
