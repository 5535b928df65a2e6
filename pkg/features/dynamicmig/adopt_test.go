package dynamicmig_test

import (
	"context"
	"encoding/json"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/features/dynamicmig"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// TestAdoptTakesOnlyInstancesCreatedForTheClaim: after a lost checkpoint,
// a claim naming the device at an existing instance's placement owns the
// instance only where it says the instance was created for it. An
// operator's MIG device is published under that very name as a static
// MIG device, and a claim that used it so must never own it: its
// Unprepare would destroy the operator's instance.
func TestAdoptTakesOnlyInstancesCreatedForTheClaim(t *testing.T) {
	const device = "gpu-0-mig-1g10gb-19-0"
	fleet, err := simfleet.Parse([]byte(fuzzFleet), "adopt")
	if err != nil {
		t.Fatal(err)
	}
	node, err := fleet.Node("node-1")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := node.Hardware().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m := inv.GPUs[0].MIGDevices[0]
	status := func(uuid string) []resourceapi.AllocatedDeviceStatus {
		return []resourceapi.AllocatedDeviceStatus{{Driver: "gpu.nvidia.com", Pool: "node-1", Device: device,
			Data: &runtime.RawExtension{Raw: []byte(`{"uuid":"` + uuid + `","parentUUID":"` + inv.GPUs[0].UUID + `"}`)}}}
	}
	for _, tc := range []struct {
		name string
		// spec is the claim's device as its CDI spec names it; nil: the
		// claim has no spec, the API server allocated it.
		spec   *claimstate.Device
		status []resourceapi.AllocatedDeviceStatus
		owns   bool
	}{
		{name: "spec of an older plugin", spec: &claimstate.Device{Pool: "node-1", Name: device}, owns: true},
		{name: "spec naming the static device's identity", spec: &claimstate.Device{Pool: "node-1", Name: device, UUID: m.UUID, ParentUUID: inv.GPUs[0].UUID}},
		{name: "allocated, status names the instance", status: status(m.UUID), owns: true},
		{name: "allocated, no status"},
		{name: "allocated, status names another instance", status: status("MIG-other")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := &preparer.Adoption{Inventory: inv, Claims: map[string]*claimstate.Claim{}}
			if tc.spec != nil {
				a.Claims["uid-1"] = &claimstate.Claim{UID: "uid-1", Phase: claimstate.PrepareCompleted, Adopted: true, Devices: []claimstate.Device{*tc.spec}}
			} else {
				claim := &resourceapi.ResourceClaim{Status: resourceapi.ResourceClaimStatus{Devices: tc.status}}
				claim.UID = "uid-1"
				a.Allocated = []preparer.AllocatedClaim{{Claim: claim, Intent: claimstate.Intent{UID: "uid-1", Namespace: "ns", Name: "c",
					Devices: []claimstate.Device{{Pool: "node-1", Name: device}}}}}
			}
			migs, _ := node.Hardware().(hardware.MIGManager)
			if err := dynamicmig.New(migs, func() bool { return true }).Adopt(context.Background(), a); err != nil {
				t.Fatal(err)
			}
			var raw json.RawMessage
			if c := a.Claims["uid-1"]; c != nil {
				raw = c.Records[dynamicmig.Name]
			}
			if owns := raw != nil; owns != tc.owns {
				t.Errorf("claim owns the instance: %v (record %s), want %v", owns, raw, tc.owns)
			}
		})
	}
}
