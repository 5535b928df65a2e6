package cluster

import (
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/hardware/sim"
)

// TestRealNodesValidate checks the real node options refused before
// anything starts.
func TestRealNodesValidate(t *testing.T) {
	fleet, err := sim.Load("dgx-a100-mig")
	if err != nil {
		t.Fatal(err)
	}
	devicePlugin := &sim.Fleet{Nodes: []sim.Node{{Name: "dp-0", Mode: sim.ModeDevicePlugin}}}
	for _, tc := range []struct {
		name  string
		r     RealNodes
		fleet *sim.Fleet
		want  string
	}{
		{"one", RealNodes{Count: 1, FleetName: "dgx-a100-mig"}, fleet, ""},
		{"more than the fleet has", RealNodes{Count: 2, FleetName: "dgx-a100-mig"}, fleet, "the fleet has 1"},
		{"negative", RealNodes{Count: -1, FleetName: "dgx-a100-mig"}, fleet, "0 or more"},
		{"a fleet file", RealNodes{Count: 1, FleetName: "fleet.yaml"}, fleet, ""},
		{"no fleet name", RealNodes{Count: 1}, fleet, "no fleet name"},
		{"a device plugin node", RealNodes{Count: 1, FleetName: "dgx-a100-mig"}, devicePlugin, "device plugin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.r.validate(tc.fleet)
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("validate: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}
