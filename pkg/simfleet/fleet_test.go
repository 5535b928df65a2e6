package simfleet_test

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// discover loads a fleet and discovers every node.
func discover(t *testing.T, nameOrPath string) map[string]*hardware.Inventory {
	t.Helper()
	f, err := simfleet.Load(nameOrPath)
	if err != nil {
		t.Fatalf("Load(%q): %v", nameOrPath, err)
	}
	out := map[string]*hardware.Inventory{}
	for _, n := range f.Nodes {
		inv, err := n.Hardware().Discover(context.Background())
		if err != nil {
			t.Fatalf("%s: Discover: %v", n.Name, err)
		}
		out[n.Name] = inv
	}
	return out
}

func TestNodeLookup(t *testing.T) {
	f, err := simfleet.Load("demo")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := f.NodeNames(), []string{"dgx-h100-0", "dgx-h100-1", "dgx-a100-0", "a100-classic", "gb200-0", "gb200-1", "gb200-2", "gb200-3"}; !reflect.DeepEqual(got, want) {
		t.Errorf("NodeNames: got %v, want %v", got, want)
	}
	_, err = f.Node("nope")
	if err == nil || !strings.Contains(err.Error(), "dgx-h100-0, dgx-h100-1, dgx-a100-0, a100-classic, gb200-0, gb200-1, gb200-2, gb200-3") {
		t.Errorf("Node(nope): got %v, want an error listing the nodes", err)
	}
	_, err = simfleet.Load("no-such-fleet")
	if err == nil || !strings.Contains(err.Error(), "dgx-a100-mig") {
		t.Errorf("Load(no-such-fleet): got %v, want an error listing the built-ins", err)
	}
}

func TestFileRoundTrip(t *testing.T) {
	want, err := simfleet.Load("demo")
	if err != nil {
		t.Fatal(err)
	}
	// The loaded fleet carries every default; written out and read back
	// it is the same fleet with the same GPUs.
	data, err := yaml.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := simfleet.Load(path)
	if err != nil {
		t.Fatalf("Load(%s): %v\n%s", path, err, data)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("round trip changed the fleet:\n%s", data)
	}
	if a, b := discover(t, "demo"), discover(t, path); !reflect.DeepEqual(a, b) {
		t.Error("round trip changed what is discovered")
	}
}
