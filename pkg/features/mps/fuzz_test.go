package mps_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/internal/featuretest"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	mpsfeature "github.com/gpudra/gpudra/pkg/features/mps"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/mps"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// FuzzRecord feeds arbitrary bytes to the MPS configurator as its record,
// in Edits, Undo and Restore, with an MPS manager whose root holds no
// daemon (no control binary ever runs). None panics; a record that does
// not decode is refused as damage, naming the record; and the CDI edits a
// record gives a claim's devices mount nothing outside the MPS root.
func FuzzRecord(f *testing.F) {
	for _, seed := range featuretest.Seeds(f, mpsfeature.Name,
		`{"daemons":[{"id":"../../..","devices":["gpu-0"]}]}`,
		`{"daemons":[{"id":"/etc","devices":["gpu-0"]}]}`,
		`{"daemons":[{"id":"","devices":["gpu-0"]},{"id":"ok","devices":["gpu-0","gpu-0"]}]}`,
		`{"daemons":null}`, `{"daemons":[null]}`, `{"daemons":[{"devices":null}]}`) {
		f.Add(seed)
	}
	sandbox := f.TempDir()
	control := filepath.Join(sandbox, "nvidia-cuda-mps-control")
	// Never run: no daemon directory exists for Undo or Restore to act on.
	if err := os.WriteFile(control, []byte("#!/bin/sh\nexit 1\n"), 0o755); err != nil {
		f.Fatal(err)
	}
	root := filepath.Join(sandbox, "mps")
	manager, err := mps.New(root, mps.WithControlBinary(control))
	if err != nil {
		f.Fatal(err)
	}
	gpu := &devicemodel.Device{Kind: devicemodel.KindGPU, GPU: hardware.GPU{UUID: "GPU-0"}}
	gpu.API.Name = "gpu-0"
	f.Fuzz(func(t *testing.T, rec []byte) {
		ctx := context.Background()
		c := preparer.Adapt[mpsfeature.Record](mpsfeature.New(manager, "", false))

		dev := &preparer.Device{State: &claimstate.Device{Pool: "node-1", Name: "gpu-0"}, Model: gpu}
		cl := &preparer.Claim{UID: "mine", Inventory: &hardware.Inventory{}, Devices: []*preparer.Device{dev}}
		err := c.Edits(ctx, cl, rec)
		featuretest.CheckRefusal[mpsfeature.Record](t, mpsfeature.Name, "Edits", rec, err)
		if dev.Edits != nil {
			for _, m := range dev.Edits.Mounts {
				if rel, err := filepath.Rel(root, m.HostPath); err != nil || rel == "." || strings.HasPrefix(rel, "..") {
					t.Fatalf("record %q mounts %s into the container, outside the MPS root %s", rec, m.HostPath, root)
				}
			}
		}

		err = c.Undo(ctx, "mine", rec)
		featuretest.CheckRefusal[mpsfeature.Record](t, mpsfeature.Name, "Undo", rec, err)
		err = c.Restore(ctx, []*claimstate.Claim{{UID: "mine", Phase: claimstate.PrepareCompleted,
			Records: map[string]json.RawMessage{mpsfeature.Name: rec}}})
		featuretest.CheckRefusal[mpsfeature.Record](t, mpsfeature.Name, "Restore", rec, err)
		if left, err := os.ReadDir(root); err != nil || len(left) != 0 {
			t.Fatalf("the MPS root holds %v (%v) after the record %q", left, err, rec)
		}
	})
}
