package draplugin

import (
	"slices"
	"testing"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/metrics"
)

// TestPreparedDevicesOfPodGroup: the info metric of a claim reserved for a
// PodGroup (KEP-5729) names the PodGroup, not a pod the plugin does not
// know; a pod's claim keeps its pod label.
func TestPreparedDevicesOfPodGroup(t *testing.T) {
	dev := claimstate.Device{Requests: []string{"channel"}, Name: "channel-0"}
	for _, tc := range []struct {
		consumer claimstate.Consumer
		want     metrics.PreparedDevice
	}{
		{claimstate.PodConsumer("trainer-0", "u0"),
			metrics.PreparedDevice{Namespace: "ns", Pod: "trainer-0", Claim: "c", Request: "channel", Device: "channel-0"}},
		{claimstate.NewConsumer(claimstate.PodGroupAPIGroup, claimstate.PodGroupResource, "trainers", "pg"),
			metrics.PreparedDevice{Namespace: "ns", PodGroup: "trainers", Claim: "c", Request: "channel", Device: "channel-0"}},
	} {
		c := &claimstate.Claim{Namespace: "ns", Name: "c", Consumers: []claimstate.Consumer{tc.consumer}, Devices: []claimstate.Device{dev}}
		got := preparedDevices(c, &hardware.Inventory{})
		if !slices.Equal(got, []metrics.PreparedDevice{tc.want}) {
			t.Errorf("%s %s: series %+v, want %+v", tc.consumer.Kind(), tc.consumer.Name, got, tc.want)
		}
	}
}
