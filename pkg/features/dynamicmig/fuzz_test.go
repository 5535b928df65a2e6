package dynamicmig_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/gpudra/gpudra/internal/featuretest"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/features/dynamicmig"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// fuzzFleet is a node with a GPU in MIG mode holding one MIG device, and
// one GPU that is not.
const fuzzFleet = `
nodes:
- name: node-1
  gpus:
  - model: H100-SXM5-80GB
    migEnabled: true
    migDevices:
    - profile: 1g.10gb
      placementStart: 0
  - model: H100-SXM5-80GB
`

// FuzzRecord feeds arbitrary bytes to the configurator as its record: as
// another claim's record in Guard, and as the claim's record in Undo and
// Edits, over simulated hardware. None panics; a record that does not
// decode is refused as damage, naming the record; and the hardware still
// discovers afterwards.
func FuzzRecord(f *testing.F) {
	fleet, err := simfleet.Parse([]byte(fuzzFleet), "fuzz")
	if err != nil {
		f.Fatal(err)
	}
	node, err := fleet.Node("node-1")
	if err != nil {
		f.Fatal(err)
	}
	inv, err := node.Hardware().Discover(context.Background())
	if err != nil {
		f.Fatal(err)
	}
	gpu, mig := inv.GPUs[0], inv.GPUs[0].MIGDevices[0]
	existing := featuretest.Marshal(f, dynamicmig.Record{Devices: []dynamicmig.Instance{{
		Device: "gpu-0-mig-1g10gb-19-0", ParentUUID: gpu.UUID, Profile: mig.Profile, ProfileID: mig.ProfileID,
		Start: mig.PlacementStart, Size: 1, UUID: mig.UUID, GIID: mig.GIID, CIID: mig.CIID,
	}}})
	for _, seed := range featuretest.Seeds(f, dynamicmig.Name, string(existing),
		`{"devices":[{"device":"x","parentUUID":"`+gpu.UUID+`","profileID":-1,"start":-7,"size":-1}]}`,
		`{"devices":[{"device":"x","parentUUID":"`+gpu.UUID+`","profileID":19,"start":99,"size":1,"uuid":"MIG-none"}]}`,
		`{"devices":null}`, `{"devices":[null]}`) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, rec []byte) {
		ctx := context.Background()
		hw := node.Hardware()
		migs, ok := hw.(hardware.MIGManager)
		if !ok {
			t.Fatal("simulated hardware manages no MIG devices")
		}
		c := preparer.Adapt[dynamicmig.Record](dynamicmig.New(migs, func() bool { return true }))
		now, err := hw.Discover(ctx)
		if err != nil {
			t.Fatal(err)
		}

		// Guard: the record is another claim's, read from the checkpoint.
		st := claimstate.New()
		st.Claims["other"] = &claimstate.Claim{UID: "other", Phase: claimstate.PrepareCompleted,
			Records: map[string]json.RawMessage{dynamicmig.Name: rec}}
		mine := &claimstate.Claim{UID: "mine", Devices: []claimstate.Device{{Pool: "node-1", Name: "gpu-0-mig-1g10gb-19-1"}}}
		ownRecord := featuretest.Marshal(t, dynamicmig.Record{Devices: []dynamicmig.Instance{{
			Device: "gpu-0-mig-1g10gb-19-1", ParentUUID: gpu.UUID, Profile: "1g.10gb", ProfileID: 19, Start: 1, Size: 1}}})
		err = c.Guard(st, mine, ownRecord)
		featuretest.CheckRefusal[dynamicmig.Record](t, dynamicmig.Name, "Guard", rec, err)

		// Edits: the claim's spec is written again from the record.
		model, err := devicemodel.Build(now, devicemodel.WithDynamicMIG())
		if err != nil {
			t.Fatal(err)
		}
		dev, ok := model.Lookup("gpu-0-mig-1g10gb-19-0")
		if !ok {
			t.Fatal("no dynamic MIG device gpu-0-mig-1g10gb-19-0")
		}
		cl := &preparer.Claim{UID: "mine", Inventory: now, Devices: []*preparer.Device{{
			State: &claimstate.Device{Pool: "node-1", Name: dev.Name()}, Model: dev}}}
		err = c.Edits(ctx, cl, rec)
		featuretest.CheckRefusal[dynamicmig.Record](t, dynamicmig.Name, "Edits", rec, err)

		// Undo, twice: it is idempotent.
		err = c.Undo(ctx, "mine", rec)
		featuretest.CheckRefusal[dynamicmig.Record](t, dynamicmig.Name, "Undo", rec, err)
		if err == nil {
			if err := c.Undo(ctx, "mine", rec); err != nil {
				t.Fatalf("second Undo of a record the first undid: %v", err)
			}
		}
		if _, err := hw.Discover(ctx); err != nil {
			t.Fatalf("the hardware does not discover after Undo of %q: %v", rec, err)
		}
	})
}
