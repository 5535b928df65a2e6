package main

import (
	"context"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/hardware/sim"
)

// TestPrepareRealNodesRefuses checks the --real-nodes values refused
// before anything is built or checked: none asks for nothing.
func TestPrepareRealNodesRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    options
		want string
	}{
		{"none", options{fleet: "demo"}, ""},
		{"negative", options{fleet: "demo", realNodes: -1}, "0 or more"},
		{"more than the fleet has", options{fleet: "dgx-a100-mig", realNodes: 2}, "has 1 nodes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fleet, err := sim.Load("dgx-a100-mig")
			if err != nil {
				t.Fatal(err)
			}
			rn, err := prepareRealNodes(context.Background(), tc.o, fleet, func(string, ...any) {})
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("error %v, want one naming %q", err, tc.want)
			}
			if rn != nil {
				t.Errorf("real nodes %+v, want none", rn)
			}
		})
	}
}
