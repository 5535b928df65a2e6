package devicemodel_test

import (
	"context"
	"testing"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

func TestBuildComputeDomain(t *testing.T) {
	f, err := simfleet.Load("gb200-nvl72")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := f.Nodes[0].Hardware().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, shared := range []bool{false, true} {
		m, err := devicemodel.BuildComputeDomain(inv, devicemodel.ComputeDomainOptions{SharedChannel: shared})
		if err != nil {
			t.Fatal(err)
		}
		if len(m.Devices) != 2 {
			t.Fatalf("%d devices, want channel-0 and daemon-0", len(m.Devices))
		}
		for i, want := range []struct {
			name string
			kind devicemodel.Kind
		}{{"channel-0", devicemodel.KindChannel}, {"daemon-0", devicemodel.KindDaemon}} {
			d := m.Devices[i].API
			if d.Name != want.name || m.Devices[i].Kind != want.kind ||
				*d.Attributes[devicemodel.AttrType].StringValue != string(want.kind) || *d.Attributes[devicemodel.AttrID].IntValue != 0 ||
				*d.Attributes[devicemodel.AttrCliqueID].StringValue != sim.DefaultClusterUUID+".1" {
				t.Errorf("device %d: %+v", i, d)
			}
		}
		if got := m.Devices[0].API.AllowMultipleAllocations; (got != nil && *got) != shared {
			t.Errorf("shared %v: allowMultipleAllocations %v", shared, got)
		}
	}

	// A driver without IMEX channels, or a node in no multi-node NVLink
	// clique (an H100 node, NVLink without a cluster UUID), publishes
	// nothing: it cannot join a domain. GPUs in two cliques publish
	// nothing and say why.
	h100, err := simfleet.Load("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	h100Inv, err := h100.Nodes[0].Hardware().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	noUUID := *inv
	noUUID.GPUs = append([]hardware.GPU(nil), inv.GPUs...)
	for i := range noUUID.GPUs {
		f := *noUUID.GPUs[i].Fabric
		f.ClusterUUID = ""
		noUUID.GPUs[i].Fabric = &f
	}
	for name, inv := range map[string]*hardware.Inventory{"H100 without a fabric": h100Inv, "no cluster UUID": &noUUID} {
		if m, err := devicemodel.BuildComputeDomain(inv, devicemodel.ComputeDomainOptions{SharedChannel: true}); err != nil || len(m.Devices) != 0 {
			t.Errorf("%s: %d devices, %v; want none", name, len(m.Devices), err)
		}
	}
	noIMEX := *inv
	noIMEX.Majors.IMEXChannels = 0
	if m, err := devicemodel.BuildComputeDomain(&noIMEX, devicemodel.ComputeDomainOptions{}); err != nil || len(m.Devices) != 0 {
		t.Errorf("without IMEX: %d devices, %v", len(m.Devices), err)
	}
	split := *inv
	split.GPUs = append([]hardware.GPU(nil), inv.GPUs...)
	f2 := *split.GPUs[3].Fabric
	f2.CliqueID = 2
	split.GPUs[3].Fabric = &f2
	if _, err := devicemodel.BuildComputeDomain(&split, devicemodel.ComputeDomainOptions{}); err == nil {
		t.Error("GPUs in two cliques: no error")
	}
}
