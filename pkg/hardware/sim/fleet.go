// Package sim simulates the GPUs of machines that a fleet file describes
// and serves them through an NVML-shaped fake, so that the real discovery
// code of package nvmlhw runs unchanged against them.
//
// A [Node] is one machine's hardware: its driver versions, GPUs (with
// their MIG devices), RDMA NICs and NVLink fabric; [Resolve] fills in
// every default and validates the nodes of a fleet. Package simfleet reads
// fleet files, which give each node these fields and, beside them, the
// settings of the plugin that serves it; this package knows nothing of
// plugins.
//
// Everything derived is deterministic, so two resolutions of a node
// describe the same GPUs.
package sim

import (
	"crypto/sha1"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults for the driver versions a node reports.
const (
	DefaultDriverVersion     = "580.65.06"
	DefaultCUDADriverVersion = "13.0"
)

// Node is one simulated machine's hardware. Its JSON (and YAML) fields are
// those of a node entry of a fleet file.
type Node struct {
	// Name is the Kubernetes node name.
	Name string `json:"name"`
	// DriverVersion is what nvmlSystemGetDriverVersion returns.
	DriverVersion string `json:"driverVersion,omitempty"`
	// CUDADriverVersion is the driver's CUDA version, "major.minor".
	CUDADriverVersion string `json:"cudaDriverVersion,omitempty"`
	// GPUs in NVML index order.
	GPUs []GPU `json:"gpus,omitempty"`
	// NICs are the node's RDMA network adapters, in the order of their
	// RDMA devices (mlx5_0, mlx5_1, ...).
	NICs []NIC `json:"nics,omitempty"`
	// Fabric, if set, puts every GPU of the node in a multi-node NVLink
	// clique: what nvmlDeviceGetGpuFabricInfo answers for each. Without it
	// the GPUs answer that they have no fabric.
	Fabric *Fabric `json:"fabric,omitempty"`
	// Topology, if set, is what the node's sysfs does not tell of its
	// GPUs, as in a VM: it applies to every GPU that does not set its own
	// pcieRoot or numaNode.
	Topology *Topology `json:"topology,omitempty"`
	// NVMLErrors makes every GPU of the node answer the NVML functions it
	// names (as nvml.h names them, e.g. "nvmlDeviceGetMemoryInfo") with the
	// NVML error given ("NOT_SUPPORTED" or "ERROR_NOT_SUPPORTED"), every
	// time, as some systems do; a GPU's own nvmlErrors come on top. See
	// [GPU.NVMLErrors].
	NVMLErrors map[string]string `json:"nvmlErrors,omitempty"`
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
	// CompletesAfter, with state NotStarted or InProgress, completes the
	// registration that long after the node's hardware was created (the
	// plugin's start, as after a boot with Fabric Manager still starting):
	// from then on the GPUs report state Completed. Without it the state
	// never changes.
	CompletesAfter *metav1.Duration `json:"completesAfter,omitempty"`
	// Status, with state Completed, is a registration error NVML reports
	// (an NVML error string such as "Unknown Error"); empty means none.
	Status string `json:"status,omitempty"`
}

// DefaultClusterUUID is the fabric cluster UUID of simulated nodes whose
// fleet file gives none: one fabric for the whole simulation.
var DefaultClusterUUID = nameUUID("fabric/cluster")

// GPU is one simulated GPU. After [Resolve] every optional field holds its
// effective value.
type GPU struct {
	// Model is a key of the model table, see [ModelNames].
	Model string `json:"model"`
	// Minor is the device minor (/dev/nvidia<minor>).
	Minor *int `json:"minor,omitempty"`
	// UUID is the GPU UUID, "GPU-<uuid>".
	UUID string `json:"uuid,omitempty"`
	// PCIBusID in extended BDF form, "0000:1b:00.0".
	PCIBusID string `json:"pciBusID,omitempty"`
	// PCIeRoot is the root complex, "pci0000:15", or [TopologyUnknown]:
	// the topology answers that it cannot read it, as on a VM's virtual
	// PCI bus, and discovery publishes the GPU without it.
	PCIeRoot string `json:"pcieRoot,omitempty"`
	// NUMANode is the NUMA node; -1 means no NUMA affinity. The default is
	// where the model's usual system has the GPU at that index (DGX A100:
	// 3, 3, 1, 1, 7, 7, 5, 5), or else 0 for the first half of the node's
	// GPUs and 1 for the second.
	NUMANode *int `json:"numaNode,omitempty"`
	// MemoryMiB overrides the model's total memory. MIG profile figures
	// stay the model's.
	MemoryMiB uint64 `json:"memoryMiB,omitempty"`
	// BoundTo, if set, is the VFIO driver (vfio-pci or
	// nvgrace-gpu-vfio-pci) the node's set-up bound the GPU to before the
	// plugin started, as `driverctl` or vfio-pci.ids= do: NVML does not
	// list the GPU (the NVML indices of the GPUs after it shift down), and
	// the node's sysfs shows it bound to that driver, with its
	// driver_override set to it.
	BoundTo string `json:"boundTo,omitempty"`
	// MIGEnabled reports whether MIG mode is on.
	MIGEnabled bool `json:"migEnabled,omitempty"`
	// MIGDevices are the MIG devices that exist on the GPU.
	MIGDevices []MIGDevice `json:"migDevices,omitempty"`
	// NVMLErrors are the NVML functions the GPU (and its MIG devices)
	// answers with an error every time, by nvml.h name, with NVML error
	// names with or without "ERROR_" (NOT_SUPPORTED, NO_PERMISSION,
	// UNKNOWN, TIMEOUT, GPU_IS_LOST, ...); SUCCESS answers a function the
	// model leaves unanswered. Resolved, it holds the model's quirks (GB10:
	// nvmlDeviceGetMemoryInfo), the node's nvmlErrors and the GPU's own, in
	// that order of precedence from last to first, with canonical names
	// ("ERROR_NOT_SUPPORTED").
	NVMLErrors map[string]string `json:"nvmlErrors,omitempty"`
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
