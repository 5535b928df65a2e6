// Package claimstate holds the prepared-claim state machine of the kubelet
// plugin: what each claim on this node holds and how far its preparation
// got. It is pure: no files, no NVML, no API server. Package checkpoint
// persists a [State]; package plugin carries the decided steps out.
package claimstate

import (
	"time"
)

// Phase is how far the preparation of one claim got.
type Phase string

const (
	// PrepareStarted means preparation began and may have left partial work
	// behind; the next Prepare or Unprepare of the claim, or the background
	// sweep, rolls that work back first.
	PrepareStarted Phase = "PrepareStarted"
	// PrepareCompleted means every device of the claim is set up and its CDI
	// spec is written; Prepare returns the recorded result again.
	PrepareCompleted Phase = "PrepareCompleted"
)

// State is the set of claims this node has (partly) prepared, keyed by
// claim UID.
type State struct {
	Claims map[string]*Claim `json:"claims"`
}

// Claim is the record of one ResourceClaim on this node.
type Claim struct {
	UID       string `json:"uid"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Phase     Phase  `json:"phase"`
	// StartedAt is when the current preparation began.
	StartedAt time.Time `json:"startedAt"`
	// Consumers are the pods (in the claim's namespace) the claim was
	// reserved for when it was prepared; the sweep drops a completed entry
	// only once the claim and all of them are gone.
	Consumers []Consumer `json:"consumers,omitempty"`
	// Devices are the allocated devices of this driver, in allocation order.
	Devices []Device `json:"devices"`
	// Adopted marks a record rebuilt from a claim's CDI spec after the
	// checkpoint was lost: it keeps the devices held and the spec in place
	// until the claim is unprepared or found gone. Namespace and Name stay
	// empty until the sweep finds the claim in the API server.
	Adopted bool `json:"adopted,omitempty"`
}

// Consumer is a pod a claim was reserved for.
type Consumer struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

// Device is one allocated device of a claim, as prepared.
type Device struct {
	// Requests are the request names (with subrequest, if any) the device
	// was allocated for.
	Requests []string `json:"requests"`
	Pool     string   `json:"pool"`
	Name     string   `json:"name"`
	// ShareID is set for devices allocated as a share of a shareable device.
	ShareID string `json:"shareID,omitempty"`
	// AdminAccess is set for admin-access results, which never hold the
	// device exclusively.
	AdminAccess bool `json:"adminAccess,omitempty"`
	// UUID of the GPU or MIG device; ParentUUID for MIG devices.
	UUID       string `json:"uuid,omitempty"`
	ParentUUID string `json:"parentUUID,omitempty"`
	// CDIDeviceIDs handed to the kubelet for this device.
	CDIDeviceIDs []string `json:"cdiDeviceIDs,omitempty"`
	// DynamicMIG is set for a MIG device that gpudra creates at Prepare and
	// destroys at Unprepare. It is what makes the instance gpudra's own: a
	// started record names the placement before anything is created, so a
	// crash midway never leaves an instance nobody owns; a completed record
	// also says what was created (UUID holds the MIG device's UUID).
	DynamicMIG *DynamicMIG `json:"dynamicMIG,omitempty"`
	// Sharing is set for a device shared through time-slicing or an MPS
	// daemon: what gpudra set up for it and must undo at Unprepare. A
	// started record names it before anything is set up.
	Sharing *Sharing `json:"sharing,omitempty"`
	// VFIO is set for a GPU passed through with VFIO: the PCI functions of
	// its IOMMU group and the drivers to give them back. A started record
	// names them before any is unbound.
	VFIO *VFIO `json:"vfio,omitempty"`
}

// VFIO is what binding a GPU's IOMMU group to VFIO changes.
type VFIO struct {
	// GPU is the GPU's PCI bus ID.
	GPU        string `json:"gpu"`
	IOMMUGroup int    `json:"iommuGroup"`
	// Functions are the functions of the group moved to a VFIO driver.
	Functions []VFIOFunction `json:"functions"`
}

// VFIOFunction is one PCI function of a bound IOMMU group.
type VFIOFunction struct {
	BusID string `json:"busID"`
	// Driver is the VFIO driver it is bound to.
	Driver string `json:"driver"`
	// OriginalDriver and OriginalDriverOverride are what it had before.
	OriginalDriver         string `json:"originalDriver,omitempty"`
	OriginalDriverOverride string `json:"originalDriverOverride,omitempty"`
}

// Sharing is how a device of a claim is shared.
type Sharing struct {
	// TimeSlice is the time-slice interval the claim holds on the GPU
	// (v1beta1.TimeSliceInterval: Default, Short, Medium, Long); the GPU is
	// the device's UUID. Empty when the device is not time-sliced.
	TimeSlice string `json:"timeSlice,omitempty"`
	// MPSDaemon is the ID of the MPS control daemon that serves the
	// device (the claim UID, or the share ID of a fractional share).
	MPSDaemon string `json:"mpsDaemon,omitempty"`
}

// DynamicMIG is the MIG instance gpudra creates for a device, on the GPU
// named by the device's ParentUUID.
type DynamicMIG struct {
	// Profile is the GPU instance profile's name, for logs ("1g.10gb").
	Profile string `json:"profile"`
	// ProfileID is the profile's own ID (nvidia-smi mig -lgip "ID").
	ProfileID int `json:"profileID"`
	// Start and Size are the placement in memory slices.
	Start int `json:"start"`
	Size  int `json:"size"`
	// GIID and CIID are the created GPU and compute instance IDs; set in
	// completed records only.
	GIID int `json:"giID,omitempty"`
	CIID int `json:"ciID,omitempty"`
}

// Overlaps reports whether two placements on one GPU share a memory slice.
func (m *DynamicMIG) Overlaps(o *DynamicMIG) bool {
	return m.Start < o.Start+o.Size && o.Start < m.Start+m.Size
}

// New returns an empty State.
func New() *State {
	return &State{Claims: map[string]*Claim{}}
}

// Clone returns a deep copy of s.
func (s *State) Clone() *State {
	out := &State{Claims: make(map[string]*Claim, len(s.Claims))}
	for uid, c := range s.Claims {
		out.Claims[uid] = c.Clone()
	}
	return out
}

// Clone returns a deep copy of c.
func (c *Claim) Clone() *Claim {
	out := *c
	out.Consumers = append([]Consumer(nil), c.Consumers...)
	out.Devices = make([]Device, len(c.Devices))
	for i, d := range c.Devices {
		d.Requests = append([]string(nil), d.Requests...)
		d.CDIDeviceIDs = append([]string(nil), d.CDIDeviceIDs...)
		if d.DynamicMIG != nil {
			m := *d.DynamicMIG
			d.DynamicMIG = &m
		}
		if d.Sharing != nil {
			sh := *d.Sharing
			d.Sharing = &sh
		}
		if d.VFIO != nil {
			v := *d.VFIO
			v.Functions = append([]VFIOFunction(nil), d.VFIO.Functions...)
			d.VFIO = &v
		}
		out.Devices[i] = d
	}
	return &out
}
