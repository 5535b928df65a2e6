package imexchannel_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/features/imexchannel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// discover returns the inventory of a node of a built-in fleet.
func discover(t *testing.T, fleet, node string) *hardware.Inventory {
	t.Helper()
	f, err := simfleet.Load(fleet)
	if err != nil {
		t.Fatal(err)
	}
	n, err := f.Node(node)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := n.Hardware().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// withFabric returns a copy of inv whose GPUs have the fabric set returns.
func withFabric(inv *hardware.Inventory, set func(i int) *hardware.Fabric) *hardware.Inventory {
	out := *inv
	out.GPUs = slices.Clone(inv.GPUs)
	for i := range out.GPUs {
		out.GPUs[i].Fabric = set(i)
	}
	return &out
}

// TestPublishOnlyWhereNodeCanJoinDomain: channel-0 and daemon-0 are
// published only by a node in a multi-node NVLink clique; every other node
// publishes an empty pool with a notice that says why, since a channel
// allocated there would leave its pod in ContainerCreating.
func TestPublishOnlyWhereNodeCanJoinDomain(t *testing.T) {
	gb200 := discover(t, "gb200-nvl72", node)
	h100 := discover(t, "dgx-h100", "dgx-h100-0")
	if h100.Majors.IMEXChannels == 0 {
		t.Fatal("the simulated H100 node has no IMEX channel major; the test would not show the fabric rule")
	}
	attached := *gb200.GPUs[0].Fabric
	noIMEX := *gb200
	noIMEX.Majors.IMEXChannels = 0

	for _, tc := range []struct {
		name       string
		inv        *hardware.Inventory
		devices    []string
		reason     string
		mentioning string
		// expected: the notice is what the hardware implies, no problem.
		expected bool
		// pending: the wait ends by itself; the plugin discovers sooner.
		pending bool
	}{
		{name: "GB200 tray in a clique", inv: gb200, devices: []string{"channel-0", "daemon-0"}},
		{name: "H100 without a fabric", inv: h100, reason: "NoNVLinkFabric", mentioning: "cannot join a ComputeDomain", expected: true},
		{name: "NVLink without a cluster UUID", inv: withFabric(gb200, func(int) *hardware.Fabric {
			f := attached
			f.ClusterUUID = ""
			return &f
		}), reason: "NoNVLinkFabric", mentioning: "no fabric cluster UUID", expected: true},
		{name: "one GPU in the clique, the others without fabric", inv: withFabric(gb200, func(i int) *hardware.Fabric {
			if i == 0 {
				return &attached
			}
			return nil
		}), devices: []string{"channel-0", "daemon-0"}},
		{name: "registration in progress", inv: withFabric(gb200, func(int) *hardware.Fabric {
			f := attached
			f.State = hardware.FabricInProgress
			return &f
		}), reason: "NVLinkFabricPending", mentioning: "GPU 0 (" + gb200.GPUs[0].UUID + ") InProgress", expected: true, pending: true},
		{name: "registration not started on one GPU", inv: withFabric(gb200, func(i int) *hardware.Fabric {
			f := attached
			if i == 1 {
				f.State = hardware.FabricNotStarted
			}
			return &f
		}), reason: "NVLinkFabricPending", mentioning: "fabric registration to complete (Fabric Manager may still be starting): GPU 1 (" + gb200.GPUs[1].UUID + ") NotStarted", expected: true, pending: true},
		{name: "registration state unknown", inv: withFabric(gb200, func(int) *hardware.Fabric {
			return &hardware.Fabric{State: hardware.FabricUnknown, Status: "nvmlDeviceGetGpuFabricInfo: ERROR_UNKNOWN"}
		}), reason: "NVLinkCliqueUnknown", mentioning: "fabric state unknown"},
		{name: "GPUs in two cliques", inv: withFabric(gb200, func(i int) *hardware.Fabric {
			f := attached
			f.CliqueID = uint32(1 + i%2)
			return &f
		}), reason: "NVLinkCliqueUnknown", mentioning: "other GPUs of the node"},
		{name: "driver without IMEX channels", inv: &noIMEX, reason: "IMEXChannelsUnavailable", mentioning: "nvidia-caps-imex-channels"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := imexchannel.NewPublisher(true)
			pub, err := preparer.Publish(p.Build, tc.inv, nil, nil, []preparer.Publisher{p})
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, d := range pub.Model.Devices {
				names = append(names, d.Name())
			}
			if !slices.Equal(names, tc.devices) {
				t.Errorf("devices %v, want %v", names, tc.devices)
			}
			if tc.reason == "" {
				if len(pub.Notices) != 0 {
					t.Errorf("notices %+v, want none", pub.Notices)
				}
				return
			}
			if len(pub.Notices) != 1 || pub.Notices[0].Reason != tc.reason || !strings.Contains(pub.Notices[0].Message, tc.mentioning) {
				t.Errorf("notices %+v, want one %s mentioning %q", pub.Notices, tc.reason, tc.mentioning)
			}
			if len(pub.Notices) == 1 && pub.Notices[0].Expected != tc.expected {
				t.Errorf("notice %s: Expected is %v, want %v", tc.reason, pub.Notices[0].Expected, tc.expected)
			}
			if len(pub.Notices) == 1 && pub.Notices[0].Pending != tc.pending {
				t.Errorf("notice %s: Pending is %v, want %v", tc.reason, pub.Notices[0].Pending, tc.pending)
			}
		})
	}
}
