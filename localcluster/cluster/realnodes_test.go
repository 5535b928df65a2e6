package cluster

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// TestRealNodesValidate checks the real node options refused before
// anything starts.
func TestRealNodesValidate(t *testing.T) {
	fleet, err := simfleet.Load("dgx-a100-mig")
	if err != nil {
		t.Fatal(err)
	}
	devicePlugin := &simfleet.Fleet{Nodes: []simfleet.Node{{Node: sim.Node{Name: "dp-0"}, PluginSettings: simfleet.PluginSettings{Mode: simfleet.ModeDevicePlugin}}}}
	for _, tc := range []struct {
		name  string
		r     RealNodes
		fleet *simfleet.Fleet
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

// TestRealNodesFallBack: on a machine that cannot run a real node, Start
// fails with what the machine lacks, unless the options ask to fall back:
// then the fleet's nodes all run simulated and the cluster says why.
func TestRealNodesFallBack(t *testing.T) {
	lacking := errors.New("no runc on PATH")
	checkRealNodeMachine = func() error { return lacking }
	t.Cleanup(func() { checkRealNodeMachine = realNodeMachine })
	fleet, err := simfleet.Parse([]byte(plainFleet), "plain")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := Options{Fleet: fleet, NoDaemons: true, RealNodes: &RealNodes{Count: 1, FleetName: "plain.yaml"}}
	if _, err := Start(ctx, opts); !errors.Is(err, lacking) {
		t.Fatalf("Start without FallBack: %v, want %v", err, lacking)
	}

	opts.RealNodes.FallBack = true
	var progress []string
	opts.Progress = func(msg string) { progress = append(progress, msg) }
	c, err := Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	}()
	if got := c.RealNodesDropped(); !strings.Contains(got, lacking.Error()) {
		t.Errorf("RealNodesDropped %q, want it to say %q", got, lacking)
	}
	if len(c.RealNodes()) != 0 || len(c.SimNodes()) != 1 || c.SimNodes()[0].Name() != "n0" {
		t.Errorf("%d real and %d simulated nodes, want n0 simulated", len(c.RealNodes()), len(c.SimNodes()))
	}
	if !slices.ContainsFunc(progress, func(l string) bool { return strings.Contains(l, "simulated nodes only") }) {
		t.Errorf("progress %q does not say the cluster runs without real nodes", progress)
	}
}
