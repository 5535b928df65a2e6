// Package hardware is the boundary between gpudra and the GPUs of one node.
//
// Everything above this package works on an [Inventory]: a plain snapshot of
// what a node holds, with no handles into NVML. Two implementations produce
// it: real NVML (package nvmlhw) and simulated fleets (package sim), which
// feed the same NVML-shaped discovery code from a fleet description so that
// discovery itself is exercised by the tests.
package hardware

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// Hardware discovers the GPUs of one node.
type Hardware interface {
	// Discover returns a fresh snapshot of the node's GPUs. A GPU whose
	// identity (handle, UUID, name, minor) cannot be read, a GPU that is
	// lost (fell off the bus), or a MIG device that cannot be read, is
	// left out of the snapshot and listed in its Problems, so that one broken GPU does not hide the others; callers
	// should log the problems. A GPU whose other properties cannot all be
	// read is in the snapshot without them, and lists them in its
	// [GPU.Unread]. Discover returns an error wrapping
	// [ErrUnavailable] when the management library cannot be used at all
	// (library missing, driver not loaded, no device count); callers keep
	// what they published before (an empty pool if nothing) and retry
	// later in that case. Other errors concern the node as a whole too
	// (device majors unreadable, ctx cancelled).
	Discover(ctx context.Context) (*Inventory, error)
}

// ErrUnavailable marks errors that mean "no GPU management library right
// now": libnvidia-ml.so missing, NVML_ERROR_DRIVER_NOT_LOADED and similar.
// They are expected on nodes where the driver comes up late.
var ErrUnavailable = errors.New("GPU management library unavailable")

// Inventory is a point-in-time snapshot of one node's GPUs.
type Inventory struct {
	// DriverVersion is the kernel driver version as NVML reports it,
	// for example "580.65.06".
	DriverVersion string `json:"driverVersion"`
	// CUDADriverVersion is the CUDA version the driver supports,
	// "major.minor", for example "13.0".
	CUDADriverVersion string `json:"cudaDriverVersion"`
	// Majors are the character-device major numbers of the driver's nodes.
	Majors Majors `json:"majors"`
	// GPUs are ordered by NVML index.
	GPUs []GPU `json:"gpus"`
	// Problems are GPUs (or MIG devices) left out of this snapshot, with
	// why. Empty when all is well. A GPU in GPUs with properties discovery
	// could not read is not a problem: its [GPU.Unread] lists them.
	Problems []Problem `json:"problems,omitempty"`
}

// Problem is one GPU or MIG device that discovery left out, or one failure
// that concerns no device in particular.
type Problem struct {
	// Index is the NVML index of the GPU concerned, or -1 when the problem
	// concerns no one GPU (a failing nvmlShutdown).
	Index int `json:"index"`
	// UUID of the GPU concerned; empty if it could not be read.
	UUID string `json:"uuid,omitempty"`
	// MIGDevice is the UUID of the MIG device left out, whose GPU is in
	// the snapshot. Empty when the problem is the whole GPU's (or, with
	// Index -1, no device's).
	MIGDevice string `json:"migDevice,omitempty"`
	// Err says what failed, naming the GPU, the MIG device and the NVML
	// call, for example "GPU 3 (GPU-...): nvmlDeviceGetMinorNumber: GPU is
	// lost".
	Err string `json:"error"`
}

// Majors are the character-device major numbers the CDI specs need so that
// runtimes can create device nodes without stat-ing the host. On a real node
// they come from /proc/devices; the NVIDIA major is fixed at 195.
type Majors struct {
	// NVIDIA is the major of /dev/nvidia<minor> and /dev/nvidiactl (195).
	NVIDIA int `json:"nvidia"`
	// UVM is the major of /dev/nvidia-uvm and /dev/nvidia-uvm-tools.
	UVM int `json:"uvm"`
	// Caps is the major of /dev/nvidia-caps/nvidia-cap<N> (MIG access).
	Caps int `json:"caps"`
	// IMEXChannels is the major of
	// /dev/nvidia-caps-imex-channels/channel<N> (/proc/devices names it
	// nvidia-caps-imex-channels); 0 when the driver has no IMEX channels.
	IMEXChannels int `json:"imexChannels,omitempty"`
}

// GPU is one physical GPU.
type GPU struct {
	// Index is the NVML device index.
	Index int `json:"index"`
	// Minor is the minor number of /dev/nvidia<minor>.
	Minor int `json:"minor"`
	// UUID as NVML reports it ("GPU-...").
	UUID string `json:"uuid"`
	// ProductName as NVML reports it, e.g. "NVIDIA H100 80GB HBM3".
	ProductName string `json:"productName"`
	// Brand as the NVIDIA DRA driver publishes it, e.g. "Nvidia", "Tesla";
	// NVML's number for a brand go-nvlib cannot name. Empty if unread.
	Brand string `json:"brand"`
	// Architecture, e.g. "Ampere", "Hopper", "Blackwell"; NVML's number
	// for an architecture go-nvlib cannot name. Empty if unread.
	Architecture string `json:"architecture"`
	// CUDAComputeCapability is "major.minor", e.g. "9.0". Empty if
	// unread.
	CUDAComputeCapability string `json:"cudaComputeCapability"`
	// MemoryBytes is the total framebuffer memory as NVML reports it
	// (an H100 80GB HBM3 reports 81559 MiB). 0 when unknown: unread, or
	// hidden from unprivileged callers while MIG mode is on.
	MemoryBytes uint64 `json:"memoryBytes"`
	// PCIBusID in extended BDF form, lower case: "0000:1b:00.0". Empty if
	// unread; PCIeRoot and NUMANode are then unknown too.
	PCIBusID string `json:"pciBusID"`
	// PCIeRoot is the root complex, "pci<domain>:<bus>"; empty if unknown.
	PCIeRoot string `json:"pcieRoot,omitempty"`
	// NUMANode is the NUMA node; nil when the device has no NUMA affinity
	// or it is unknown.
	NUMANode *int `json:"numaNode,omitempty"`
	// MIGCapable reports whether the GPU supports MIG at all; false when
	// its MIG mode could not be read, so that MIG is not offered.
	MIGCapable bool `json:"migCapable"`
	// MIGEnabled reports whether MIG mode is currently on.
	MIGEnabled bool `json:"migEnabled"`
	// MIGDevices are the MIG devices that exist now, ordered by
	// (GIProfileID, PlacementStart). Empty when they could not be listed
	// ([PropertyMIGDevices] is then in Unread).
	MIGDevices []MIGDevice `json:"migDevices,omitempty"`
	// MIGMemorySlices is the number of MIG memory slices of the GPU (8 on
	// A100, H100 and H200); 0 when MIGProfiles is empty.
	MIGMemorySlices int `json:"migMemorySlices,omitempty"`
	// MIGProfiles are the GPU instance profiles the GPU supports, with
	// their possible placements, in NVML profile index order. NVML answers
	// these queries with MIG mode off too, so they are filled in for every
	// MIG-capable GPU. Empty when the GPU is not MIG-capable, when they
	// could not be read, when the GPU's memory (which names them) is
	// unknown, and when MIG mode is on but the MIG devices could not be
	// listed: a placement could collide with one of them.
	MIGProfiles []MIGProfile `json:"migProfiles,omitempty"`
	// Fabric is the GPU's place in a multi-node NVLink fabric
	// (nvmlDeviceGetGpuFabricInfo); nil when the GPU or its driver has no
	// such fabric.
	Fabric *Fabric `json:"fabric,omitempty"`
	// VFIODriver is the VFIO driver (vfio-pci, nvgrace-gpu-vfio-pci) the
	// GPU was found bound to in sysfs, for a GPU NVML does not list
	// because the node's set-up passed it through before the plugin
	// started; empty for every GPU NVML lists. Such a GPU is known by its
	// PCI function only: PCIBusID is set; UUID, ProductName, memory and
	// the rest are unknown; Index and Minor are its position among the
	// node's NVIDIA GPUs in PCI bus order (the minor it would have under
	// nvidia on the usual node, where minors follow bus order), which
	// names its VFIO device. It is offered for
	// passthrough only, never as a CUDA device, and never rebound to
	// nvidia.
	VFIODriver string `json:"vfioDriver,omitempty"`
	// Unread are the properties discovery could not read, in the order it
	// read them; empty when it read them all. What identifies a GPU (UUID,
	// minor, name) is never unread: a GPU without it is left out instead,
	// as is a GPU that is lost.
	Unread []Unread `json:"unread,omitempty"`
}

// Property names a property of a GPU that discovery may fail to read, as
// the attribute or capacity it feeds is named where there is one.
type Property string

// The properties of a GPU that may be unread. Each of them leaves its
// field of [GPU] empty, and what is derived from it is not offered.
const (
	PropertyBrand                 Property = "brand"
	PropertyArchitecture          Property = "architecture"
	PropertyCUDAComputeCapability Property = "cudaComputeCapability"
	// PropertyMemory leaves MemoryBytes 0: no memory capacity, no shared
	// GPU, no MIG profiles.
	PropertyMemory   Property = "memory"
	PropertyPCIBusID Property = "pciBusID"
	PropertyPCIeRoot Property = "pcieRoot"
	PropertyNUMANode Property = "numaNode"
	// PropertyMIGMode leaves the GPU not MIG-capable.
	PropertyMIGMode Property = "migMode"
	// PropertyMIGProfiles leaves MIGProfiles empty: no dynamic MIG.
	PropertyMIGProfiles Property = "migProfiles"
	// PropertyMIGDevices, on a GPU in MIG mode, leaves MIGDevices and
	// MIGProfiles empty.
	PropertyMIGDevices Property = "migDevices"
)

// Unread is one property of a GPU that discovery could not read. NVML
// leaves some queries unanswered on some systems (GB10's unified memory
// has no memory info; an Azure VM has no PCIe root), and NVIDIA's driver
// then leaves the GPU, or the whole node, out; gpudra publishes the GPU
// without the property instead, and reports it.
type Unread struct {
	// Property is what is unknown.
	Property Property `json:"property"`
	// Query is what was asked: an NVML function as nvml.h names it, with
	// its argument where it matters ("nvmlDeviceGetMemoryInfo",
	// "nvmlDeviceGetGpuInstanceProfileInfo(0)"), or the file read for
	// what NVML does not answer ("/sys/bus/pci/devices/0000:1b:00.0").
	Query string `json:"query"`
	// Err is why the query failed, e.g. "ERROR_NOT_SUPPORTED".
	Err string `json:"error"`
}

// IsUnread reports whether discovery could not read property p of g.
func (g *GPU) IsUnread(p Property) bool {
	return slices.ContainsFunc(g.Unread, func(u Unread) bool { return u.Property == p })
}

// String renders u for logs and events:
// "memory: nvmlDeviceGetMemoryInfo: ERROR_NOT_SUPPORTED".
func (u Unread) String() string {
	return fmt.Sprintf("%s: %s: %s", u.Property, u.Query, u.Err)
}

// FabricState is how far a GPU's registration with the NVLink fabric
// (with the fabric manager) has come.
type FabricState string

// The fabric states NVML reports (NVML_GPU_FABRIC_STATE_*), and one for a
// state that could not be read.
const (
	FabricNotStarted FabricState = "NotStarted"
	FabricInProgress FabricState = "InProgress"
	FabricCompleted  FabricState = "Completed"
	// FabricUnknown: NVML failed to answer; Fabric.Status says why.
	FabricUnknown FabricState = "Unknown"
)

// Fabric is a GPU's membership in a multi-node NVLink fabric. The GPUs of
// one NVLink partition (a clique, e.g. the 72 GPUs of a GB200 NVL72 rack)
// share the cluster UUID and clique ID once registration completed.
type Fabric struct {
	// ClusterUUID identifies the fabric; empty (all zeroes in NVML) on
	// systems that have NVLink but no multi-node NVLink.
	ClusterUUID string `json:"clusterUUID,omitempty"`
	// CliqueID identifies the GPU's NVLink partition in the fabric.
	CliqueID uint32 `json:"cliqueID"`
	// State is how far registration has come.
	State FabricState `json:"state"`
	// Status is the registration's error once State is Completed (NVML's
	// status), or why the state is Unknown; empty when all is well.
	Status string `json:"status,omitempty"`
}

// Attached reports whether the GPU completed registration with a
// multi-node NVLink fabric, without error.
func (f *Fabric) Attached() bool {
	return f != nil && f.State == FabricCompleted && f.Status == "" && f.ClusterUUID != ""
}

// Registering reports whether the GPU's registration with the NVLink
// fabric has not finished yet (NotStarted or InProgress): at boot, Fabric
// Manager may still be starting. It finishes by itself, unlike a failed
// registration or a state NVML could not answer.
func (f *Fabric) Registering() bool {
	return f != nil && (f.State == FabricNotStarted || f.State == FabricInProgress)
}

// MIGDevice returns the MIG device with the UUID, nil when the inventory
// (which may be nil) lists none.
func (inv *Inventory) MIGDevice(uuid string) *MIGDevice {
	if inv == nil || uuid == "" {
		return nil
	}
	for gi := range inv.GPUs {
		for mi := range inv.GPUs[gi].MIGDevices {
			if m := &inv.GPUs[gi].MIGDevices[mi]; m.UUID == uuid {
				return m
			}
		}
	}
	return nil
}

// CliqueID returns the node's clique, "<cluster UUID>.<clique ID>", as
// NVIDIA's driver names it: the one clique every fabric-attached GPU of
// the node is in. It is "" when no GPU is attached to a multi-node fabric
// (a node that is in no clique). GPUs whose fabric state could not be read,
// or whose registration failed or has not finished, and GPUs that disagree
// about their clique, make it an error naming the GPU: a node must not join
// a clique it may not be in.
func (inv *Inventory) CliqueID() (string, error) {
	clique := ""
	for _, g := range inv.GPUs {
		f := g.Fabric
		switch {
		case f == nil:
			continue
		case f.State == FabricUnknown:
			return "", fmt.Errorf("GPU %d (%s): NVLink fabric state unknown: %s", g.Index, g.UUID, f.Status)
		case f.State != FabricCompleted:
			return "", fmt.Errorf("GPU %d (%s): NVLink fabric registration not finished (state %s)", g.Index, g.UUID, f.State)
		case f.Status != "":
			return "", fmt.Errorf("GPU %d (%s): NVLink fabric registration failed: %s", g.Index, g.UUID, f.Status)
		case f.ClusterUUID == "":
			continue // NVLink, but no multi-node NVLink
		}
		id := fmt.Sprintf("%s.%d", f.ClusterUUID, f.CliqueID)
		if clique != "" && id != clique {
			return "", fmt.Errorf("GPU %d (%s) is in clique %s, other GPUs of the node in %s", g.Index, g.UUID, id, clique)
		}
		clique = id
	}
	return clique, nil
}

// MIGProfile is one GPU instance profile of a GPU, with the compute
// instance profile that spans a whole instance of it, as NVML reports them
// (nvidia-smi mig -lgip and -lgipp show the same figures).
type MIGProfile struct {
	// Name is the NVIDIA profile name, e.g. "1g.10gb" or "1g.10gb+me".
	Name string `json:"name"`
	// GIProfileID is the NVML_GPU_INSTANCE_PROFILE_* index.
	GIProfileID int `json:"giProfileID"`
	// ProfileID is the profile's own ID (nvmlGpuInstanceProfileInfo_t.id,
	// the "ID" column of nvidia-smi mig -lgip); device names use it.
	ProfileID int `json:"profileID"`
	// CIProfileID and CIEngProfileID are the NVML compute instance profile
	// and engine profile indexes of the compute instance spanning a whole
	// GPU instance of this profile.
	CIProfileID    int `json:"ciProfileID"`
	CIEngProfileID int `json:"ciEngProfileID"`
	// Slices is the number of compute slices (the "g" in the name).
	Slices int `json:"slices"`
	// Instances is how many instances of the profile fit on the GPU.
	Instances int `json:"instances"`
	// MemoryBytes of one instance.
	MemoryBytes uint64 `json:"memoryBytes"`
	// Engine counts of one instance.
	Multiprocessors int `json:"multiprocessors"`
	CopyEngines     int `json:"copyEngines"`
	Decoders        int `json:"decoders"`
	Encoders        int `json:"encoders"`
	JPEGEngines     int `json:"jpegEngines"`
	OFAEngines      int `json:"ofaEngines"`
	// PlacementSize is the size of every placement, in memory slices.
	PlacementSize int `json:"placementSize"`
	// PlacementStarts are the possible placement starts, in memory slices,
	// ascending.
	PlacementStarts []int `json:"placementStarts"`
}

// MIGPlacement names one place for a MIG device: a GPU instance profile at
// a placement start on a parent GPU. The scheduler hands out places; two
// GPU instances never share one.
type MIGPlacement struct {
	// ParentUUID is the UUID of the GPU.
	ParentUUID string `json:"parentUUID"`
	// ProfileID is the GPU instance profile's own ID ([MIGProfile.ProfileID]).
	ProfileID int `json:"profileID"`
	// Start is the placement start in memory slices.
	Start int `json:"start"`
}

// String renders p for logs and errors: "GPU-...:19@3".
func (p MIGPlacement) String() string {
	return fmt.Sprintf("%s:%d@%d", p.ParentUUID, p.ProfileID, p.Start)
}

// MIGManager creates and destroys MIG devices on GPUs whose MIG mode is
// on. Implementations are safe for concurrent use.
type MIGManager interface {
	// CreateMIGDevice creates a GPU instance of p's profile at p's start
	// and one compute instance spanning it, and returns the new MIG device
	// as Discover would report it. If a step fails, it destroys what it
	// created before returning, and the error names the step and the
	// NVML error. A placement that overlaps an existing GPU instance
	// fails with an error wrapping [ErrPlacementInUse].
	CreateMIGDevice(ctx context.Context, p MIGPlacement) (MIGDevice, error)
	// DestroyMIGDevice destroys the compute instances of the GPU instance
	// at p, then the GPU instance. It returns nil when no GPU instance of
	// that profile is at that start (already destroyed), so callers may
	// retry it. The caller decides whether the instance is its to destroy.
	DestroyMIGDevice(ctx context.Context, p MIGPlacement) error
}

// ErrPlacementInUse marks a MIG placement that overlaps an existing GPU
// instance (NVML answers NVML_ERROR_INSUFFICIENT_RESOURCES).
var ErrPlacementInUse = errors.New("MIG placement overlaps an existing GPU instance")

// MIGModeSwitcher turns MIG mode on or off (Hopper and newer can do it
// without a node reboot).
type MIGModeSwitcher interface {
	// SetMIGMode turns MIG mode of the GPU with the given UUID on or off.
	// The driver refuses while any client holds the GPU or, to turn it off,
	// while GPU instances exist; the GPU may be reset and come back with
	// another minor number, so callers re-discover after a switch.
	SetMIGMode(ctx context.Context, gpuUUID string, enabled bool) error
}

// MIGDevice is one existing MIG device (a GPU instance with one compute
// instance spanning it), as an operator or gpudra created it. A compute
// instance smaller than its GPU instance is not one: discovery reports it
// as a [Problem].
type MIGDevice struct {
	// UUID of the MIG device ("MIG-...").
	UUID string `json:"uuid"`
	// Profile is the NVIDIA profile name, e.g. "1g.10gb" or "1g.10gb+me".
	Profile string `json:"profile"`
	// GIProfileID is the NVML GPU instance profile index, one of the
	// NVML_GPU_INSTANCE_PROFILE_* constants (0 for 1 slice, 7 for 1 slice
	// REV1 "+me", 9 for 1 slice REV2), as passed to
	// nvmlDeviceGetGpuInstanceProfileInfo to create an instance.
	GIProfileID int `json:"giProfileID"`
	// ProfileID is the GPU instance profile's own ID
	// (nvmlGpuInstanceProfileInfo_t.id), the "ID" column of
	// `nvidia-smi mig -lgip`: 19 for 1g.10gb, 0 for 7g.80gb. NVIDIA's DRA
	// driver names MIG devices with this one, not with GIProfileID.
	ProfileID int `json:"profileID"`
	// CIProfileID is the NVML compute instance profile index, one of the
	// NVML_COMPUTE_INSTANCE_PROFILE_* constants.
	CIProfileID int `json:"ciProfileID"`
	// CIEngProfileID is the NVML compute instance engine profile index, one
	// of the NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_* constants.
	CIEngProfileID int `json:"ciEngProfileID"`
	// GIID and CIID identify the instances on the parent GPU.
	GIID int `json:"giID"`
	CIID int `json:"ciID"`
	// PlacementStart and PlacementSize are in memory-slice units.
	PlacementStart int `json:"placementStart"`
	PlacementSize  int `json:"placementSize"`
	// MemoryBytes of the GPU instance.
	MemoryBytes uint64 `json:"memoryBytes"`
	// Engine counts of the instance.
	Multiprocessors int `json:"multiprocessors"`
	CopyEngines     int `json:"copyEngines"`
	Decoders        int `json:"decoders"`
	Encoders        int `json:"encoders"`
	JPEGEngines     int `json:"jpegEngines"`
	OFAEngines      int `json:"ofaEngines"`
	// GICapMinor and CICapMinor are the minors of the
	// /dev/nvidia-caps/nvidia-cap<N> access nodes of the GPU instance and
	// the compute instance (from /proc/driver/nvidia-caps/mig-minors).
	GICapMinor int `json:"giCapMinor"`
	CICapMinor int `json:"ciCapMinor"`
}
