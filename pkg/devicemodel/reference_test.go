package devicemodel_test

import (
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// TestReferenceDocumentsEveryAttributeAndCapacity keeps
// docs/reference/attributes.md in step with what the device model
// publishes: every attribute and capacity name of the devices built for
// the built-in fleets, with dynamic MIG, VFIO beside the GPUs and
// memory-compute sharing, is named there (capacities numbered per memory
// slice as their pattern, memorySlice<N>).
func TestReferenceDocumentsEveryAttributeAndCapacity(t *testing.T) {
	doc, err := os.ReadFile("../../docs/reference/attributes.md")
	if err != nil {
		t.Fatal(err)
	}
	vfio := devicemodel.WithVFIO(devicemodel.VFIOBeside, func(g hardware.GPU) (devicemodel.VFIOInfo, bool) {
		return devicemodel.VFIOInfo{VendorID: "0x10de", DeviceID: "0x2330", IOMMUGroup: 20 + g.Index}, true
	})
	optionSets := map[string][]devicemodel.Option{
		"dynamic MIG":   {devicemodel.WithDynamicMIG()},
		"VFIO beside":   {vfio},
		"shared GPUs":   {devicemodel.WithSharing(devicemodel.Sharing{Mode: devicemodel.SharingMemoryCompute})},
		"static layout": nil,
	}
	numbered := regexp.MustCompile(`[0-9]+$`)
	names := map[string]string{} // name -> where it was seen
	for _, fleet := range []string{"dgx-h100", "dgx-a100-mig", "gb200-nvl72"} {
		f := builtin(fleet)(t)
		inv := discover(t, f, f.Nodes[0].Name)
		for set, opts := range optionSets {
			m, err := devicemodel.Build(inv, opts...)
			if err != nil {
				t.Fatalf("%s, %s: %v", fleet, set, err)
			}
			for _, d := range m.Devices {
				for name := range d.API.Attributes {
					names[string(name)] = fleet + ", " + set + ", " + d.API.Name
				}
				for name := range d.API.Capacity {
					names[numbered.ReplaceAllString(string(name), "<N>")] = fleet + ", " + set + ", " + d.API.Name
				}
			}
		}
	}
	if len(names) < 10 {
		t.Fatalf("only %d attribute and capacity names published: the check checks little", len(names))
	}
	for _, name := range slices.Sorted(maps.Keys(names)) {
		if !strings.Contains(string(doc), "`"+name+"`") {
			t.Errorf("docs/reference/attributes.md does not name %q (published on %s)", name, names[name])
		}
	}
}
