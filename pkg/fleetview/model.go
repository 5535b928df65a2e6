// Package fleetview holds the read-only picture of a GPU fleet: a model
// built from the API server's objects (nodes -> GPUs -> MIG devices, VFIO
// devices and shares -> the claims and pods holding them, with taints and
// health), kept current by informers, and served over HTTP as a page, a
// snapshot JSON and server-sent events carrying only the nodes that
// changed.
package fleetview

// Fleet is the page's model of the cluster: every node that has devices
// of the driver, or is a Node object, sorted by name.
type Fleet struct {
	// Driver is the DRA driver whose devices are shown.
	Driver string `json:"driver"`
	// Nodes are sorted by name.
	Nodes []Node `json:"nodes"`
	// Slices counts the driver's ResourceSlices: none means gpudra does
	// not publish in this cluster (or under another driver name).
	Slices int `json:"slices"`
}

// Node is one node with its GPUs.
type Node struct {
	Name string `json:"name"`
	// Ready is the Node's Ready condition: True, False or Unknown; empty
	// when the Node object is not known (not readable, or only slices
	// name it).
	Ready         string  `json:"ready,omitempty"`
	Unschedulable bool    `json:"unschedulable,omitempty"`
	Taints        []Taint `json:"taints,omitempty"`
	GPUs          []GPU   `json:"gpus,omitempty"`
}

// Taint is a node taint or a DRA device taint.
type Taint struct {
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect"`
	// Rule names the DeviceTaintRule that put a device taint; empty for a
	// taint in the ResourceSlice (the driver's own, e.g. health) or on a
	// node.
	Rule string `json:"rule,omitempty"`
}

// Health values of a GPU.
const (
	HealthOK = "ok"
	// HealthUnhealthy: a device of the GPU carries a taint under the
	// driver's name (gpudra's health taints: xid, ecc-dbe, gpu-lost).
	HealthUnhealthy = "unhealthy"
)

// GPU is one physical GPU and the devices a driver publishes for it: the
// full GPU, its MIG devices and its VFIO passthrough device.
type GPU struct {
	// Name is the full GPU's device name (gpu-<minor>), or for a GPU
	// published only as MIG or VFIO devices the name they derive from.
	Name     string `json:"name"`
	Product  string `json:"product,omitempty"`
	UUID     string `json:"uuid,omitempty"`
	PCIBusID string `json:"pciBusID,omitempty"`
	Memory   string `json:"memory,omitempty"`
	// Sharing is the full GPU's sharingMode attribute (none, shares,
	// memory-compute, unlimited).
	Sharing string `json:"sharing,omitempty"`
	Health  string `json:"health"`
	// Taints are the device taints of the GPU's devices, once each.
	Taints []Taint `json:"taints,omitempty"`
	// Holders hold the full GPU device: one, or with sharing one per
	// share.
	Holders []Holder `json:"holders,omitempty"`
	// MIG lists the MIG devices that exist (static MIG, with a UUID) or
	// are allocated; dynamic placements nobody holds are only counted.
	MIG     []Device `json:"mig,omitempty"`
	MIGFree int      `json:"migFree,omitempty"`
	// VFIO is the GPU's passthrough device, if published.
	VFIO *Device `json:"vfio,omitempty"`
}

// Device is a MIG or VFIO device of a GPU.
type Device struct {
	Name    string   `json:"name"`
	Type    string   `json:"type"`
	Profile string   `json:"profile,omitempty"`
	UUID    string   `json:"uuid,omitempty"`
	Memory  string   `json:"memory,omitempty"`
	Taints  []Taint  `json:"taints,omitempty"`
	Holders []Holder `json:"holders,omitempty"`
}

// Holder is a claim's allocation of a device and the pods using it.
type Holder struct {
	// Claim is namespace/name.
	Claim   string `json:"claim"`
	Request string `json:"request,omitempty"`
	// ShareID and Consumed are set for a share of a device allocated
	// with consumable capacity.
	ShareID  string            `json:"shareID,omitempty"`
	Consumed map[string]string `json:"consumed,omitempty"`
	Pods     []PodRef          `json:"pods,omitempty"`
	// PodGroups are the PodGroups (namespace/name) the claim is reserved
	// for (KEP-5729): their pods share it, and those that name it are in
	// Pods.
	PodGroups []string `json:"podGroups,omitempty"`
}

// PodRef is a pod using a claim.
type PodRef struct {
	// Name is namespace/name.
	Name string `json:"name"`
	// Phase is the pod's phase; empty when the pod is not readable.
	Phase string `json:"phase,omitempty"`
}
