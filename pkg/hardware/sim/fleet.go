// Package sim describes simulated GPU fleets and serves their nodes' GPUs
// through an NVML-shaped fake, so that the real discovery code of package
// nvmlhw runs unchanged against them.
//
// A fleet is a YAML file (or the name of a built-in fleet, see
// [BuiltinNames]):
//
//	nodes:
//	- name: dgx-h100-0
//	  driverVersion: "580.65.06"    # optional, default 580.65.06
//	  cudaDriverVersion: "13.0"     # optional, default 13.0
//	  sharing: shares=4             # optional: the plugin's --sharing
//	  mode: device-plugin           # optional: dra (default) or device-plugin (the local cluster's kubelet device manager)
//	  devicePlugin: {version: v1}   # optional, with mode device-plugin: NVIDIA's device-plugin config file
//	  gpus:
//	  - model: H100-SXM5-80GB       # see ModelNames
//	    minor: 0                    # optional, default: the GPU's index
//	    uuid: GPU-...               # optional, derived from node name and index
//	    pciBusID: "0000:1b:00.0"    # optional, from the model's usual system
//	    pcieRoot: "pci0000:15"      # optional, pairs of GPUs share a root
//	    numaNode: 3                 # optional, from the model's usual system; -1: none
//	    memoryMiB: 81559            # optional, the model's figure
//	    migEnabled: true
//	    migDevices:                 # MIG devices that exist
//	    - profile: 1g.10gb
//	      placementStart: 0         # optional, first free allowed start
//	      uuid: MIG-...             # optional, derived
//	    - profile: 2g.20gb
//	      computeSlices: 1          # optional: split into 1c.2g.20gb instances
//	  nics:                         # optional: RDMA NICs, published by the local cluster's simulated NIC driver
//	  - model: ConnectX-7           # see NICModelNames
//	    pcieRoot: "pci0000:15"      # required: the root it shares with GPUs
//	    linkType: infiniband        # optional: infiniband (default) or ethernet
//	    speedGbps: 400              # optional, the model's
//	    pciBusID: "0000:18:00.0"    # optional
//	    numaNode: 0                 # optional, a GPU's under the same root, else -1
//	  fabric:                       # optional: the node's GPUs are in a multi-node NVLink clique
//	    cliqueID: 1                 # the NVLink partition
//	    clusterUUID: ...            # optional, default DefaultClusterUUID
//	    state: Completed            # optional: NotStarted, InProgress, Completed (default)
//	    status: ""                  # optional: a registration error (with Completed)
//
// Everything derived is deterministic, so two loads of a fleet describe the
// same GPUs.
package sim

import (
	"context"
	"crypto/sha1"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/pkg/deviceplugin"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// Defaults for the driver versions a node reports.
const (
	DefaultDriverVersion     = "580.65.06"
	DefaultCUDADriverVersion = "13.0"
)

//go:embed fleets/*.yaml
var builtinFleets embed.FS

// Fleet is a set of simulated nodes.
type Fleet struct {
	// Nodes of the fleet, in file order.
	Nodes []Node `json:"nodes"`
}

// Node is one simulated machine.
type Node struct {
	// Name is the Kubernetes node name.
	Name string `json:"name"`
	// DriverVersion is what nvmlSystemGetDriverVersion returns.
	DriverVersion string `json:"driverVersion,omitempty"`
	// CUDADriverVersion is the driver's CUDA version, "major.minor".
	CUDADriverVersion string `json:"cudaDriverVersion,omitempty"`
	// MIGMode is the --mig-mode the node's plugin runs with, "dynamic" or
	// "static"; empty leaves it to the plugin (dynamic). A node whose
	// operator created MIG devices is "static".
	MIGMode string `json:"migMode,omitempty"`
	// Sharing is the --sharing the node's plugin runs with: "none",
	// "memory-compute", "shares=<N>" or "unlimited"; empty leaves it to
	// the plugin (none).
	Sharing string `json:"sharing,omitempty"`
	// SharingDefault is the --sharing-default the node's plugin runs with:
	// "whole" (a claim that asks for no capacity gets the whole GPU) or
	// "share" (one share, as NVIDIA's driver gives); empty leaves it to the
	// plugin (whole).
	SharingDefault string `json:"sharingDefault,omitempty"`
	// Mode is which of gpudra's plugins serves the node's GPUs in the
	// local cluster: "dra" (the default) or "device-plugin" (gpudra's
	// device plugin under the kubelet's device manager).
	Mode string `json:"mode,omitempty"`
	// DevicePlugin is the device plugin's config file, NVIDIA's format
	// (version, flags.migStrategy, sharing.timeSlicing), for a node in
	// device-plugin mode.
	DevicePlugin json.RawMessage `json:"devicePlugin,omitempty"`
	// GPUs in NVML index order.
	GPUs []GPU `json:"gpus,omitempty"`
	// NICs are the node's RDMA network adapters, in the order of their
	// RDMA devices (mlx5_0, mlx5_1, ...).
	NICs []NIC `json:"nics,omitempty"`
	// Fabric, if set, puts every GPU of the node in a multi-node NVLink
	// clique: what nvmlDeviceGetGpuFabricInfo answers for each. Without it
	// the GPUs answer that they have no fabric.
	Fabric *Fabric `json:"fabric,omitempty"`
}

// The modes of a node ([Node.Mode]).
const (
	ModeDRA          = "dra"
	ModeDevicePlugin = "device-plugin"
)

// DevicePluginConfig is the node's device-plugin config, nil when it has
// none (its defaults).
func (n *Node) DevicePluginConfig() (*deviceplugin.Config, error) {
	if len(n.DevicePlugin) == 0 {
		return nil, nil
	}
	return deviceplugin.ParseConfig(n.DevicePlugin)
}

// Fabric is a node's place in a multi-node NVLink fabric.
type Fabric struct {
	// ClusterUUID identifies the fabric; DefaultClusterUUID when empty.
	ClusterUUID string `json:"clusterUUID,omitempty"`
	// CliqueID identifies the NVLink partition (e.g. one GB200 NVL72
	// rack) in the fabric.
	CliqueID uint32 `json:"cliqueID"`
	// State is NotStarted, InProgress or Completed (the default).
	State string `json:"state,omitempty"`
	// Status, with state Completed, is a registration error NVML reports
	// (an NVML error string such as "Unknown Error"); empty means none.
	Status string `json:"status,omitempty"`
}

// DefaultClusterUUID is the fabric cluster UUID of simulated nodes whose
// fleet file gives none: one fabric for the whole simulation.
var DefaultClusterUUID = nameUUID("fabric/cluster")

// GPU is one simulated GPU. After [Load] or [Parse] every optional field
// holds its effective value.
type GPU struct {
	// Model is a key of the model table, see [ModelNames].
	Model string `json:"model"`
	// Minor is the device minor (/dev/nvidia<minor>).
	Minor *int `json:"minor,omitempty"`
	// UUID is the GPU UUID, "GPU-<uuid>".
	UUID string `json:"uuid,omitempty"`
	// PCIBusID in extended BDF form, "0000:1b:00.0".
	PCIBusID string `json:"pciBusID,omitempty"`
	// PCIeRoot is the root complex, "pci0000:15".
	PCIeRoot string `json:"pcieRoot,omitempty"`
	// NUMANode is the NUMA node; -1 means no NUMA affinity. The default is
	// where the model's usual system has the GPU at that index (DGX A100:
	// 3, 3, 1, 1, 7, 7, 5, 5), or else 0 for the first half of the node's
	// GPUs and 1 for the second.
	NUMANode *int `json:"numaNode,omitempty"`
	// MemoryMiB overrides the model's total memory. MIG profile figures
	// stay the model's.
	MemoryMiB uint64 `json:"memoryMiB,omitempty"`
	// MIGEnabled reports whether MIG mode is on.
	MIGEnabled bool `json:"migEnabled,omitempty"`
	// MIGDevices are the MIG devices that exist on the GPU.
	MIGDevices []MIGDevice `json:"migDevices,omitempty"`
}

// MIGDevice is one existing GPU instance with its compute instances: one
// spanning it, which makes one MIG device, unless ComputeSlices says
// otherwise.
type MIGDevice struct {
	// Profile is the GPU instance profile name, e.g. "1g.10gb".
	Profile string `json:"profile"`
	// PlacementStart is the first memory slice the instance occupies.
	PlacementStart *int `json:"placementStart,omitempty"`
	// UUID is the MIG device UUID, "MIG-<uuid>", of the first (or only)
	// compute instance. Those of further compute instances are derived.
	UUID string `json:"uuid,omitempty"`
	// ComputeSlices is the size of the instance's compute instances in
	// compute slices. The default, the profile's own slice count, is one
	// compute instance spanning the GPU instance. A smaller size splits the
	// GPU instance into as many compute instances of that size as fit (1
	// on a 2g.20gb instance: two 1c.2g.20gb instances), each a MIG device
	// of its own. gpudra does not publish those; they are here to test
	// that discovery reports them.
	ComputeSlices int `json:"computeSlices,omitempty"`
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

// uuidNamespace is the namespace of the name-based UUIDs of simulated
// devices (a random value, fixed forever so that UUIDs stay stable).
var uuidNamespace = [16]byte{0x6f, 0x1c, 0x2a, 0x93, 0x4e, 0x57, 0x4b, 0x0d, 0x9a, 0x11, 0x3c, 0x8e, 0x20, 0x71, 0xd4, 0x5b}

// nameUUID returns the RFC 9562 version 5 (SHA-1, name-based) UUID of name
// in uuidNamespace.
func nameUUID(name string) string {
	h := sha1.New()
	h.Write(uuidNamespace[:])
	h.Write([]byte(name))
	u := h.Sum(nil)[:16]
	u[6] = u[6]&0x0f | 0x50 // version 5
	u[8] = u[8]&0x3f | 0x80 // RFC 9562 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// gpuUUID derives the UUID of the GPU at index i of a node.
func gpuUUID(node string, i int) string {
	return "GPU-" + nameUUID(fmt.Sprintf("gpu/%s/%d", node, i))
}

// migUUID derives the UUID of a MIG device from its parent and placement,
// which identify it on a node.
func migUUID(node string, gpu int, profile string, start int) string {
	return "MIG-" + nameUUID(fmt.Sprintf("mig/%s/%d/%s/%d", node, gpu, profile, start))
}

// ciUUID derives the UUID of the MIG device of compute instance ci > 0 of a
// split GPU instance.
func ciUUID(node string, gpu int, profile string, start, ci int) string {
	return "MIG-" + nameUUID(fmt.Sprintf("mig/%s/%d/%s/%d/ci%d", node, gpu, profile, start, ci))
}
