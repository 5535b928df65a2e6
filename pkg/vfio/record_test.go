package vfio_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/vfio"
)

// TestRecordJSON pins the record's JSON, which checkpoints hold: changing it
// needs a checkpoint migration.
func TestRecordJSON(t *testing.T) {
	rec := vfio.Record{GPU: gpu, IOMMUGroup: gpuGroup, Functions: []vfio.Function{
		{BusID: gpu, Driver: vfio.NVGraceGPUVFIOPCI, OriginalDriver: "nvidia"},
		{BusID: audio, Driver: vfio.VFIOPCI, OriginalDriverOverride: "snd_hda_intel"},
	}}
	data, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"gpu":"0000:1b:00.0","iommuGroup":27,"functions":[` +
		`{"busID":"0000:1b:00.0","driver":"nvgrace-gpu-vfio-pci","originalDriver":"nvidia"},` +
		`{"busID":"0000:1b:00.1","driver":"vfio-pci","originalDriverOverride":"snd_hda_intel"}]}`
	if string(data) != want {
		t.Errorf("JSON\n got %s\nwant %s", data, want)
	}
}

func TestRecordValidate(t *testing.T) {
	valid := func() vfio.Record {
		return vfio.Record{GPU: gpu, IOMMUGroup: gpuGroup, Functions: []vfio.Function{
			{BusID: gpu, Driver: vfio.VFIOPCI, OriginalDriver: "nvidia"},
			{BusID: audio, Driver: vfio.VFIOPCI},
		}}
	}
	tests := map[string]struct {
		change func(*vfio.Record)
		want   string // "" for valid
	}{
		"valid": {change: func(*vfio.Record) {}},
		"GPU not a bus ID": {
			change: func(r *vfio.Record) { r.GPU = "../../x" },
			want:   `gpu: PCI bus ID "../../x"`,
		},
		"negative group": {
			change: func(r *vfio.Record) { r.IOMMUGroup = -1 },
			want:   "iommuGroup: -1 is negative",
		},
		"GPU missing from the functions": {
			change: func(r *vfio.Record) { r.Functions = r.Functions[1:] },
			want:   "functions: the GPU 0000:1b:00.0 is not among them",
		},
		"function listed twice": {
			change: func(r *vfio.Record) { r.Functions = append(r.Functions, r.Functions[1]) },
			want:   "functions[2].busID: 0000:1b:00.1 is listed twice",
		},
		"driver a path": {
			change: func(r *vfio.Record) { r.Functions[0].Driver = "../../../kernel" },
			want:   `functions[0].driver: "../../../kernel" is not a driver name`,
		},
		"driver empty": {
			change: func(r *vfio.Record) { r.Functions[1].Driver = "" },
			want:   `functions[1].driver: "" is not a driver name`,
		},
		"original driver a path": {
			change: func(r *vfio.Record) { r.Functions[0].OriginalDriver = "a/b" },
			want:   `functions[0].originalDriver: "a/b" is not a driver name`,
		},
		"original override with a newline": {
			change: func(r *vfio.Record) { r.Functions[0].OriginalDriverOverride = "nvidia\nvfio-pci" },
			want:   `functions[0].originalDriverOverride: "nvidia\nvfio-pci" is not a driver name`,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rec := valid()
			tc.change(&rec)
			err := rec.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate = %v, want valid", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
}
