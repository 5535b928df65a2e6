package simfleet_test

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// fuzzDiscoverNodes bounds how many nodes of an accepted fleet FuzzParse
// discovers, to keep each run short.
const fuzzDiscoverNodes = 3

// FuzzParse feeds arbitrary bytes to the fleet file parser, seeded with the
// built-in fleets. Parse never panics and refuses with a message; a fleet
// it accepts is complete (every default filled in): written back as YAML it
// parses to the same fleet, and each of its nodes discovers through the
// fake NVML and builds a device model without error.
func FuzzParse(f *testing.F) {
	fleets, err := filepath.Glob(filepath.Join("fleets", "*.yaml"))
	if err != nil || len(fleets) == 0 {
		f.Fatalf("no built-in fleets: %v", err)
	}
	for _, name := range fleets {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, seed := range []string{
		"nodes: []",
		"nodes:\n- name: n\n  gpus:\n  - model: A100-SXM4-40GB\n    migEnabled: true\n    migDevices:\n    - profile: 1g.5gb\n      placementStart: 6\n    - profile: 3g.20gb\n      computeSlices: 1\n",
		"nodes:\n- name: n\n  sharing: shares=4\n  migMode: static\n  gpus:\n  - model: H100-SXM5-80GB\n    minor: 254\n    numaNode: -1\n    memoryMiB: 1\n",
		"nodes:\n- name: n\n  gpus:\n  - model: H100-SXM5-80GB\n    pciBusID: \"0000:1b:00.0\"\n  - model: H100-SXM5-80GB\n    pciBusID: \"0000:1b:00.0\"\n",
		"nodes:\n- {name: n, name: m}\n",
		"nodes:\n- name: n\n  gpus:\n  - model: H100-SXM5-80GB\n    pciBusId: x\n",
		"- a\n- b\n", "{", "",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fleet, err := simfleet.Parse(data, "fuzz")
		if err != nil {
			if err.Error() == "" {
				t.Fatal("Parse error without a message")
			}
			return
		}
		written, err := yaml.Marshal(fleet)
		if err != nil {
			t.Fatalf("marshal an accepted fleet: %v", err)
		}
		again, err := simfleet.Parse(written, "written back")
		if err != nil {
			t.Fatalf("an accepted fleet, written back, does not parse: %v\n%s", err, written)
		}
		if !reflect.DeepEqual(again, fleet) {
			t.Fatalf("an accepted fleet changed when written back and parsed:\n%s", written)
		}
		for i, name := range fleet.NodeNames() {
			if i == fuzzDiscoverNodes {
				break
			}
			n, err := fleet.Node(name)
			if err != nil {
				t.Fatal(err)
			}
			inv, err := n.Hardware().Discover(context.Background())
			if err != nil {
				t.Fatalf("node %s of an accepted fleet does not discover: %v\n%s", name, err, written)
			}
			if len(inv.GPUs) != len(n.GPUs) {
				t.Fatalf("node %s: discovered %d GPUs, the fleet has %d", name, len(inv.GPUs), len(n.GPUs))
			}
			// Not with the node's sharing: a GPU with too little memory to
			// share is a valid fleet, which the plugin refuses to share.
			if _, err := devicemodel.Build(inv, devicemodel.WithDynamicMIG()); err != nil {
				t.Fatalf("node %s of an accepted fleet builds no device model: %v\n%s", name, err, written)
			}
		}
	})
}
