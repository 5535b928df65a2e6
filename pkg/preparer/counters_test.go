package preparer

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// twoMIGGPUs is a node of two MIG-enabled H100s, published with dynamic
// MIG: a counter set per GPU that its full device and MIG placements
// consume.
const twoMIGGPUs = `
nodes:
- name: mig-0
  gpus:
  - {model: H100-SXM5-80GB, migEnabled: true}
  - {model: H100-SXM5-80GB, migEnabled: true}
`

func dynamicMIGModel(t *testing.T) *devicemodel.Model {
	t.Helper()
	fleet, err := simfleet.Parse([]byte(twoMIGGPUs), "test")
	if err != nil {
		t.Fatal(err)
	}
	node, err := fleet.Node("mig-0")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := node.Hardware().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	model, err := devicemodel.Build(inv, devicemodel.WithDynamicMIG())
	if err != nil {
		t.Fatal(err)
	}
	return model
}

// TestCheckCounters: the node's check of shared counters, what it charges
// and whom it names.
func TestCheckCounters(t *testing.T) {
	const (
		pool = "mig-0"
		// Two 1g.10gb+me placements of GPU 0: no memory slice in common,
		// but one optical flow engine between them.
		me0 = "gpu-0-mig-1g10gb-me-20-0"
		me1 = "gpu-0-mig-1g10gb-me-20-1"
		// The same profile on GPU 1, another counter set.
		gpu1me = "gpu-1-mig-1g10gb-me-20-0"
	)
	model := dynamicMIGModel(t)
	dev := func(name string) claimstate.Device { return claimstate.Device{Pool: pool, Name: name} }
	claim := func(uid string, devices ...claimstate.Device) *claimstate.Claim {
		return &claimstate.Claim{UID: uid, Namespace: "default", Name: "claim-" + uid, Phase: claimstate.PrepareCompleted, Devices: devices}
	}
	admin := func(d claimstate.Device) claimstate.Device { d.AdminAccess = true; return d }
	otherPool := func(d claimstate.Device) claimstate.Device { d.Pool = "elsewhere"; return d }
	for _, tc := range []struct {
		name   string
		model  *devicemodel.Model
		others []*claimstate.Claim
		claim  *claimstate.Claim
		// refusedBy is the claim the refusal names; "" when the claim fits.
		refusedBy, counter string
	}{
		{name: "no model", others: []*claimstate.Claim{claim("a", dev(me0))}, claim: claim("z", dev(me1))},
		{name: "alone on the node", model: model, claim: claim("z", dev(me1))},
		{name: "engine held by another claim", model: model, others: []*claimstate.Claim{claim("a", dev(me0))}, claim: claim("z", dev(me1)), refusedBy: "a", counter: "ofa-engines"},
		{name: "whole-GPU placement held by another claim", model: model, others: []*claimstate.Claim{claim("a", dev("gpu-0-mig-7g80gb-0-0"))}, claim: claim("z", dev(me1)), refusedBy: "a"},
		{name: "the other GPU's counters", model: model, others: []*claimstate.Claim{claim("a", dev(gpu1me))}, claim: claim("z", dev(me1))},
		{name: "lowest UID among holders is named", model: model,
			others: []*claimstate.Claim{claim("c", dev(me0)), claim("b", dev(me0)), claim("d", dev(gpu1me))}, claim: claim("z", dev(me1)), refusedBy: "b", counter: "ofa-engines"},
		{name: "a device held by two claims is charged once", model: model,
			others: []*claimstate.Claim{claim("a", dev(me0)), claim("b", dev(me0))}, claim: claim("z", dev(me0))},
		{name: "admin access is not charged", model: model, others: []*claimstate.Claim{claim("a", admin(dev(me0)))}, claim: claim("z", dev(me1))},
		{name: "admin access of one holder does not hide another's", model: model,
			others: []*claimstate.Claim{claim("a", admin(dev(me0))), claim("b", dev(me0))}, claim: claim("z", dev(me1)), refusedBy: "b", counter: "ofa-engines"},
		{name: "another pool is not charged", model: model, others: []*claimstate.Claim{claim("a", otherPool(dev(me0)))}, claim: claim("z", dev(me1))},
		{name: "the claim's own start record is not another claim", model: model, others: []*claimstate.Claim{claim("z", dev(me0))}, claim: claim("z", dev(me1))},
		{name: "unpublished device is not charged", model: model, others: []*claimstate.Claim{claim("a", dev("gpu-9"))}, claim: claim("z", dev(me1))},
		// The scheduler never allocates this; with no other holder there is
		// no one to wait for, so the node does not refuse it.
		{name: "the claim's own devices only", model: model, claim: claim("z", dev(me0), dev(me1))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := claimstate.New()
			for _, c := range tc.others {
				s.Claims[c.UID] = c
			}
			err := checkCounters(tc.model, pool, s, tc.claim)
			if tc.refusedBy == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var refused *RefusedError
			if !errors.As(err, &refused) {
				t.Fatalf("got %v, want a refusal naming claim %s", err, tc.refusedBy)
			}
			for _, want := range []string{"claim default/claim-" + tc.refusedBy + " (uid " + tc.refusedBy + ")", tc.counter, me1} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("refusal %q does not name %q", err, want)
				}
			}
		})
	}
}
