// Package simfleet reads fleet files: the simulated nodes that the local
// cluster runs and that the --fleet of gpudra's commands stands in for
// NVML with. A node entry holds the node's hardware (package sim, which
// simulates it) and, beside it, the settings of the plugin that serves the
// node ([PluginSettings]), which the simulator knows nothing of.
//
// A fleet is a YAML file (or the name of a built-in fleet, see
// [BuiltinNames]):
//
//	nodes:
//	- name: dgx-h100-0
//	  driverVersion: "580.65.06"    # optional, default 580.65.06
//	  cudaDriverVersion: "13.0"     # optional, default 13.0
//	  migMode: static               # optional: the plugin's --mig-mode
//	  migModeSwitching: true        # optional, with migMode dynamic: the plugin's --mig-mode-switching
//	  sharing: shares=4             # optional: the plugin's --sharing
//	  sharingDefault: share         # optional: the plugin's --sharing-default
//	  mode: device-plugin           # optional: dra (default) or device-plugin (the local cluster's kubelet device manager)
//	  devicePlugin: {version: v1}   # optional, with mode device-plugin: NVIDIA's device-plugin config file
//	  gpus:
//	  - model: H100-SXM5-80GB       # see sim.ModelNames
//	    minor: 0                    # optional, default: the GPU's index
//	    uuid: GPU-...               # optional, derived from node name and index
//	    pciBusID: "0000:1b:00.0"    # optional, from the model's usual system
//	    pcieRoot: "pci0000:15"      # optional, pairs of GPUs share a root; unknown: cannot be read
//	    numaNode: 3                 # optional, from the model's usual system; -1: none
//	    memoryMiB: 81559            # optional, the model's figure
//	    boundTo: vfio-pci           # optional: bound to vfio-pci (or nvgrace-gpu-vfio-pci) at start; NVML does not list it
//	    migEnabled: true
//	    migDevices:                 # MIG devices that exist
//	    - profile: 1g.10gb
//	      placementStart: 0         # optional, first free allowed start
//	      uuid: MIG-...             # optional, derived
//	    - profile: 2g.20gb
//	      computeSlices: 1          # optional: split into 1c.2g.20gb instances
//	    nvmlErrors:                 # optional: this GPU's, over the node's and the model's
//	      nvmlDeviceGetMemoryInfo: SUCCESS  # SUCCESS answers what the model leaves unanswered
//	  nics:                         # optional: RDMA NICs, published by the local cluster's simulated NIC driver
//	  - model: ConnectX-7           # see sim.NICModelNames
//	    pcieRoot: "pci0000:15"      # required: the root it shares with GPUs
//	    linkType: infiniband        # optional: infiniband (default) or ethernet
//	    speedGbps: 400              # optional, the model's
//	    pciBusID: "0000:18:00.0"    # optional
//	    numaNode: 0                 # optional, a GPU's under the same root, else -1
//	  topology:                     # optional: what sysfs does not tell, for every GPU (a VM's)
//	    pcieRoot: unknown           # optional: no GPU's PCIe root can be read
//	    numaNode: none              # optional: no GPU has NUMA affinity (-1)
//	  nvmlErrors:                   # optional: NVML functions every GPU of the node always fails
//	    nvmlDeviceGetBrand: NOT_SUPPORTED  # nvml.h name: NVML error, with or without ERROR_
//	  fabric:                       # optional: the node's GPUs are in a multi-node NVLink clique
//	    cliqueID: 1                 # the NVLink partition
//	    clusterUUID: ...            # optional, default sim.DefaultClusterUUID
//	    state: Completed            # optional: NotStarted, InProgress, Completed (default)
//	    completesAfter: 20s         # optional, with NotStarted or InProgress: Completed that long after the plugin starts
//	    status: ""                  # optional: a registration error (with Completed)
//
// Everything derived is deterministic, so two loads of a fleet describe the
// same GPUs.
package simfleet

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
)

//go:embed fleets/*.yaml
var builtinFleets embed.FS

// Fleet is a fleet file: a set of simulated nodes.
type Fleet struct {
	// Nodes of the fleet, in file order.
	Nodes []Node `json:"nodes"`
}

// Node is one node entry of a fleet file: the machine's hardware and the
// settings of the plugin that serves it. Both are embedded without a JSON
// name, so their fields sit side by side in the one mapping of the entry.
type Node struct {
	sim.Node
	PluginSettings
}

// BuiltinNames returns the names of the built-in fleets, sorted.
func BuiltinNames() []string {
	entries, err := builtinFleets.ReadDir("fleets")
	if err != nil {
		panic(fmt.Sprintf("embedded fleets: %v", err)) // compiled in; cannot fail
	}
	var names []string
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".yaml"))
	}
	slices.Sort(names)
	return names
}

// Load returns the built-in fleet called nameOrPath, or else the fleet in
// the file at that path.
func Load(nameOrPath string) (*Fleet, error) {
	if slices.Contains(BuiltinNames(), nameOrPath) {
		data, err := builtinFleets.ReadFile(path.Join("fleets", nameOrPath+".yaml"))
		if err != nil {
			return nil, fmt.Errorf("built-in fleet %s: %w", nameOrPath, err)
		}
		return Parse(data, "built-in fleet "+nameOrPath)
	}
	data, err := os.ReadFile(nameOrPath)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("fleet %q is neither a built-in fleet (%s) nor a file: %w",
				nameOrPath, strings.Join(BuiltinNames(), ", "), err)
		}
		return nil, fmt.Errorf("read fleet file: %w", err)
	}
	return Parse(data, nameOrPath)
}

// Parse decodes a fleet description strictly (an unknown field is an
// error), fills in every default and validates the result. source names
// the description in errors.
func Parse(data []byte, source string) (*Fleet, error) {
	// YAML to JSON (rejecting duplicate keys), then a case-sensitive strict
	// decode as Kubernetes does: encoding/json alone would take
	// "pciBusId" for "pciBusID" without a word.
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return nil, fmt.Errorf("fleet %s: %w", source, err)
	}
	var f Fleet
	strictErrs, err := kjson.UnmarshalStrict(js, &f)
	if err != nil {
		return nil, fmt.Errorf("fleet %s: %w", source, err)
	}
	if len(strictErrs) > 0 {
		return nil, fmt.Errorf("fleet %s: %w", source, errors.Join(strictErrs...))
	}
	if err := f.resolve(); err != nil {
		return nil, fmt.Errorf("fleet %s: %w", source, err)
	}
	return &f, nil
}

// resolve fills in the defaults of every node's hardware and validates the
// fleet: the hardware (sim.Resolve), then each node's plugin settings.
func (f *Fleet) resolve() error {
	hw := make([]*sim.Node, len(f.Nodes))
	for i := range f.Nodes {
		hw[i] = &f.Nodes[i].Node
	}
	errs := []error{sim.Resolve(hw)}
	for i := range f.Nodes {
		errs = append(errs, f.Nodes[i].PluginSettings.validate(sim.NodePlace(i, f.Nodes[i].Name))...)
	}
	return errors.Join(errs...)
}

// Node returns the node with the given name.
func (f *Fleet) Node(name string) (*Node, error) {
	for i := range f.Nodes {
		if f.Nodes[i].Name == name {
			return &f.Nodes[i], nil
		}
	}
	return nil, fmt.Errorf("fleet has no node %q (nodes: %s)", name, strings.Join(f.NodeNames(), ", "))
}

// Discover loads the fleet nameOrPath (as Load) and discovers the hardware
// of its node nodeName, as the plugin on that node would.
func Discover(ctx context.Context, nameOrPath, nodeName string) (*hardware.Inventory, error) {
	f, err := Load(nameOrPath)
	if err != nil {
		return nil, err
	}
	n, err := f.Node(nodeName)
	if err != nil {
		return nil, err
	}
	return n.Hardware().Discover(ctx)
}

// NodeNames returns the names of the fleet's nodes in fleet order.
func (f *Fleet) NodeNames() []string {
	names := make([]string, len(f.Nodes))
	for i, n := range f.Nodes {
		names[i] = n.Name
	}
	return names
}
