package sim

import (
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/yaml"
)

// testFleet is what the tests of this package read of a fleet file: the
// nodes' hardware. Package simfleet reads fleet files for everyone else;
// it imports this package, so these tests cannot import it.
type testFleet struct {
	Nodes []Node `json:"nodes"`
}

// Node returns the node with the given name.
func (f *testFleet) Node(name string) (*Node, error) {
	for i := range f.Nodes {
		if f.Nodes[i].Name == name {
			return &f.Nodes[i], nil
		}
	}
	return nil, fmt.Errorf("fleet has no node %q", name)
}

// resolve fills in the nodes' defaults and validates them.
func (f *testFleet) resolve() error {
	nodes := make([]*Node, len(f.Nodes))
	for i := range f.Nodes {
		nodes[i] = &f.Nodes[i]
	}
	return Resolve(nodes)
}

// parseFleet reads a fleet description of hardware alone, strictly.
func parseFleet(data []byte, source string) (*testFleet, error) {
	var f testFleet
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("fleet %s: %w", source, err)
	}
	if err := f.resolve(); err != nil {
		return nil, fmt.Errorf("fleet %s: %w", source, err)
	}
	return &f, nil
}

// loadFleet reads the hardware of the built-in fleet called name, from
// package simfleet's directory. The plugin settings beside the hardware
// are skipped: simfleet reads them, strictly, and its tests load every
// built-in fleet.
func loadFleet(name string) (*testFleet, error) {
	data, err := os.ReadFile(filepath.Join("..", "..", "simfleet", "fleets", name+".yaml"))
	if err != nil {
		return nil, err
	}
	var f testFleet
	if err := yaml.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("fleet %s: %w", name, err)
	}
	if err := f.resolve(); err != nil {
		return nil, fmt.Errorf("fleet %s: %w", name, err)
	}
	return &f, nil
}
