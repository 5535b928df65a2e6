package migmode_test

import (
	"context"
	"testing"

	"github.com/gpudra/gpudra/internal/featuretest"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/features/migmode"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// node is the plugin around the configurator: it discovers the simulated
// hardware again and drops events.
type node struct{ hw hardware.Hardware }

func (n node) Rediscover(ctx context.Context) (*hardware.Inventory, error) { return n.hw.Discover(ctx) }
func (n node) Event(string, string, string)                                {}

// FuzzRecord feeds arbitrary bytes to the MIG mode configurator as its
// record, in Apply (a retried preparation applies the record the
// checkpoint holds) and Undo, over a simulated DGX H100 whose GPUs can
// switch. Neither panics; Apply refuses a record that does not decode as
// damage, naming the record; Undo leaves modes as they are whatever the
// record says; and the hardware discovers afterwards.
func FuzzRecord(f *testing.F) {
	fleet, err := simfleet.Load("dgx-h100")
	if err != nil {
		f.Fatal(err)
	}
	n, err := fleet.Node("dgx-h100-0")
	if err != nil {
		f.Fatal(err)
	}
	inv, err := n.Hardware().Discover(context.Background())
	if err != nil {
		f.Fatal(err)
	}
	uuid := inv.GPUs[0].UUID
	for _, seed := range featuretest.Seeds(f, migmode.Name,
		`{"gpus":[{"uuid":"`+uuid+`","enable":true}]}`,
		`{"gpus":[{"uuid":"`+uuid+`","enable":false},{"uuid":"`+uuid+`","enable":true}]}`,
		`{"gpus":[{"uuid":"GPU-unknown","enable":true}]}`,
		`{"gpus":null}`, `{"gpus":[null]}`) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, rec []byte) {
		ctx := context.Background()
		hw := n.Hardware()
		switcher, ok := hw.(hardware.MIGModeSwitcher)
		if !ok {
			t.Fatal("simulated hardware cannot switch MIG modes")
		}
		c := preparer.Adapt[migmode.Record](migmode.New(switcher, node{hw}))
		if err := c.Undo(ctx, "mine", rec); err != nil {
			t.Fatalf("Undo of %q = %v; MIG modes stay as switched, so there is nothing to fail", rec, err)
		}
		now, err := hw.Discover(ctx)
		if err != nil {
			t.Fatal(err)
		}
		model, err := devicemodel.Build(now)
		if err != nil {
			t.Fatal(err)
		}
		dev, ok := model.Lookup("gpu-0")
		if !ok {
			t.Fatal("no device gpu-0")
		}
		cl := &preparer.Claim{UID: "mine", Inventory: now, Devices: []*preparer.Device{{
			State: &claimstate.Device{Pool: "dgx-h100-0", Name: dev.Name()}, Model: dev}}}
		_, err = c.Apply(ctx, cl, rec)
		featuretest.CheckRefusal[migmode.Record](t, migmode.Name, "Apply", rec, err)
		if _, err := hw.Discover(ctx); err != nil {
			t.Fatalf("the hardware does not discover after Apply of %q: %v", rec, err)
		}
	})
}
