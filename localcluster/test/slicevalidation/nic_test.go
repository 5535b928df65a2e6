package slicevalidation_test

import (
	"fmt"
	"testing"

	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"

	"github.com/gpudra/gpudra/localcluster/simnic"
)

// TestNICSlicesValidate runs the slices of the local cluster's simulated
// NIC driver through the API server's create path, as
// TestResourceSlicesValidate does gpudra's: the NICs of every built-in
// fleet, and a node with every NIC model, both link types, NICs without bus
// ID or NUMA node, and more NICs than one slice holds.
func TestNICSlicesValidate(t *testing.T) {
	type node struct {
		label string
		nics  []sim.NIC
	}
	var nodes []node
	for _, name := range simfleet.BuiltinNames() {
		f, err := simfleet.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range f.Nodes {
			if len(n.NICs) > 0 {
				nodes = append(nodes, node{name + "/" + n.Name, n.NICs})
			}
		}
	}
	if len(nodes) == 0 {
		t.Fatal("no built-in fleet has NICs")
	}
	none, zero := -1, 0
	var many []sim.NIC
	for i := range 130 {
		models := sim.NICModelNames()
		nic := sim.NIC{Model: models[i%len(models)], PCIeRoot: fmt.Sprintf("pci%04x:%02x", i/64, i%64*4), LinkType: sim.LinkEthernet, SpeedGbps: 100, NUMANode: &none}
		if i%2 == 0 {
			nic.LinkType, nic.PCIBusID, nic.NUMANode = sim.LinkInfiniBand, fmt.Sprintf("%04x:%02x:00.1", i/64, i%64*4+1), &zero
		}
		many = append(many, nic)
	}
	nodes = append(nodes, node{"hand-built/130 NICs", many})

	for _, n := range nodes {
		t.Run(n.label, func(t *testing.T) {
			res, err := simnic.DriverResources("node-0", n.nics)
			if err != nil {
				t.Fatal(err)
			}
			objs := sliceObjects("node-0", simnic.DefaultDriverName, res)
			devices := 0
			for _, obj := range objs {
				devices += len(obj.Spec.Devices)
				for _, err := range validateCreate(t, obj) {
					t.Errorf("%s: %v", obj.Name, err)
				}
			}
			if devices != len(n.nics) {
				t.Errorf("%d devices published for %d NICs", devices, len(n.nics))
			}
		})
	}
}
