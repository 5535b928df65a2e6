package vfio_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/internal/featuretest"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	vfiofeature "github.com/gpudra/gpudra/pkg/features/vfio"
	"github.com/gpudra/gpudra/pkg/preparer"
	"github.com/gpudra/gpudra/pkg/simfleet"
	"github.com/gpudra/gpudra/pkg/vfio"
)

// FuzzRecord feeds arbitrary bytes to the passthrough configurator as its
// record, in Edits and Undo, over a simulated DGX H100's fake sysfs. None
// panics; a record that does not decode is refused as damage, naming the
// record; a second Undo of a record the first undid succeeds; and a
// record is never taken for one that steers writes outside the functions
// it names (vfio.Record.Validate guards the sysfs paths).
func FuzzRecord(f *testing.F) {
	fleet, err := simfleet.Load("dgx-h100")
	if err != nil {
		f.Fatal(err)
	}
	node, err := fleet.Node("dgx-h100-0")
	if err != nil {
		f.Fatal(err)
	}
	inv, err := node.Hardware().Discover(context.Background())
	if err != nil {
		f.Fatal(err)
	}
	bus := inv.GPUs[0].PCIBusID
	for _, seed := range featuretest.Seeds(f, vfiofeature.Name,
		`{"devices":[{"device":"gpu-vfio-0","gpu":"`+bus+`","iommuGroup":-1,"functions":[{"busID":"`+bus+`","driver":"vfio-pci","originalDriver":"nvidia"}]}]}`,
		`{"devices":[{"device":"gpu-vfio-0","gpu":"`+bus+`","iommuGroup":0,"functions":[{"busID":"../../../x","driver":"vfio-pci"}]}]}`,
		`{"devices":[{"device":"gpu-vfio-0","gpu":"`+bus+`","iommuGroup":0,"functions":[{"busID":"`+bus+`","driver":"nvidia","originalDriver":"vfio-pci"}]}]}`,
		`{"devices":[{"device":"gpu-vfio-0","gpu":"`+bus+`","functions":null}]}`,
		`{"devices":[null]}`) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, rec []byte) {
		ctx := context.Background()
		fs, err := node.Sysfs()
		if err != nil {
			t.Fatal(err)
		}
		var writes []string
		fs.OnWrite(func(name string) { writes = append(writes, name) })
		cfg := &vfiofeature.Config{Mode: devicemodel.VFIOBeside, FS: fs, Busy: fs, Modules: fs}
		f, err := vfiofeature.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		c := preparer.Adapt[vfiofeature.Record](f)

		// Edits: the claim's spec is written again from the record.
		model, err := devicemodel.Build(inv, cfg.ModelOption())
		if err != nil {
			t.Fatal(err)
		}
		dev, ok := model.Lookup("gpu-vfio-0")
		if !ok {
			t.Fatal("no VFIO device gpu-vfio-0")
		}
		cl := &preparer.Claim{UID: "mine", Inventory: inv, Devices: []*preparer.Device{{
			State: &claimstate.Device{Pool: "dgx-h100-0", Name: dev.Name()}, Model: dev}}}
		err = c.Edits(ctx, cl, rec)
		featuretest.CheckRefusal[vfiofeature.Record](t, vfiofeature.Name, "Edits", rec, err)

		// Undo, twice: it is idempotent.
		err = c.Undo(ctx, "mine", rec)
		featuretest.CheckRefusal[vfiofeature.Record](t, vfiofeature.Name, "Undo", rec, err)
		if err == nil {
			if err := c.Undo(ctx, "mine", rec); err != nil {
				t.Fatalf("second Undo of a record the first undid: %v", err)
			}
		}
		if r, err := (preparer.Codec[vfiofeature.Record]{Name: vfiofeature.Name}).Decode(rec); err == nil {
			for _, w := range writes {
				if !named(r, w) {
					t.Fatalf("Undo of %q wrote %s, which the record does not name", rec, w)
				}
			}
		} else if len(writes) > 0 {
			t.Fatalf("an undecodable record led to writes %v", writes)
		}
		if _, err := vfio.ReadPCIDevice(fs, bus); err != nil {
			t.Fatalf("the GPU's function cannot be read after Undo of %q: %v", rec, err)
		}
	})
}

// named reports whether the sysfs path written is one of a function the
// record names, or a bind or unbind file of a driver it names.
func named(r *vfiofeature.Record, path string) bool {
	if path == "bus/pci/drivers_probe" {
		return true
	}
	for _, p := range r.Devices {
		for _, f := range p.Functions {
			if strings.HasPrefix(path, "bus/pci/devices/"+f.BusID+"/") {
				return true
			}
			for _, d := range []string{f.Driver, f.OriginalDriver} {
				if d != "" && (path == "bus/pci/drivers/"+d+"/bind" || path == "bus/pci/drivers/"+d+"/unbind") {
					return true
				}
			}
		}
	}
	return false
}
