// Package claimstate holds the prepared-claim state machine of the kubelet
// plugin: what each claim on this node holds and how far its preparation
// got. It is pure: no files, no NVML, no API server. Package checkpoint
// persists a [State]; package draplugin carries the decided steps out.
package claimstate

import (
	"encoding/json"
	"maps"
	"slices"
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
	UID string `json:"uid"`
	// Namespace and Name are empty for a claim adopted without them (see
	// Adopted, and a completed claim of NVIDIA's DRA driver's checkpoint,
	// which does not record them) until the sweep finds it in the API
	// server.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Phase     Phase  `json:"phase"`
	// StartedAt is when the current preparation began.
	StartedAt time.Time `json:"startedAt"`
	// Consumers are what the claim was reserved for when it was prepared
	// (status.reservedFor, in the claim's namespace): pods, or a PodGroup
	// whose pods share the claim (KEP-5729); the sweep drops a completed
	// entry only once the claim and all of them are gone.
	Consumers []Consumer `json:"consumers,omitempty"`
	// Devices are the allocated devices of this driver, in allocation order.
	Devices []Device `json:"devices"`
	// Adopted marks a record rebuilt from a claim's CDI spec after the
	// checkpoint was lost: it keeps the devices held and the spec in place
	// until the claim is unprepared or found gone. Namespace and Name stay
	// empty until the sweep finds the claim in the API server.
	Adopted bool `json:"adopted,omitempty"`
	// Records are what each device configurator (MIG, VFIO, sharing, ...)
	// set up for the claim, by configurator name, in the configurator's
	// own format: claimstate never looks inside. A started record names
	// what is about to be set up before anything is, so that a crash
	// midway never leaves hardware state that no record owns.
	Records map[string]json.RawMessage `json:"records,omitempty"`
}

// Consumer is an object a claim was reserved for: an entry of the claim's
// status.reservedFor.
type Consumer struct {
	// APIGroup and Resource are the consumer's kind as status.reservedFor
	// names it; both are empty for a pod, so that a pod reads the same as
	// in records written before other kinds were kept.
	APIGroup string `json:"apiGroup,omitempty"`
	Resource string `json:"resource,omitempty"`
	Name     string `json:"name"`
	UID      string `json:"uid"`
}

// The kinds of consumer Kubernetes reserves claims for.
const (
	// PodGroupAPIGroup and PodGroupResource name a PodGroup
	// (scheduling.k8s.io), for which the resource claim controller
	// reserves a claim that the PodGroup's spec.resourceClaims lists,
	// instead of for each of its pods (KEP-5729, gates
	// DRAWorkloadResourceClaims and GenericWorkload).
	PodGroupAPIGroup = "scheduling.k8s.io"
	PodGroupResource = "podgroups"
)

// PodConsumer returns the consumer record of a pod.
func PodConsumer(name, uid string) Consumer { return Consumer{Name: name, UID: uid} }

// NewConsumer returns the consumer record of a status.reservedFor entry:
// a pod ("" and "pods") is recorded without its kind.
func NewConsumer(apiGroup, resource, name, uid string) Consumer {
	if apiGroup == "" && resource == "pods" {
		return PodConsumer(name, uid)
	}
	return Consumer{APIGroup: apiGroup, Resource: resource, Name: name, UID: uid}
}

// IsPod reports whether the consumer is a pod.
func (c Consumer) IsPod() bool { return c.APIGroup == "" && (c.Resource == "" || c.Resource == "pods") }

// IsPodGroup reports whether the consumer is a PodGroup.
func (c Consumer) IsPodGroup() bool {
	return c.APIGroup == PodGroupAPIGroup && c.Resource == PodGroupResource
}

// Kind is how messages name the consumer's kind: "pod", "PodGroup", or
// resource.group for any other.
func (c Consumer) Kind() string {
	switch {
	case c.IsPod():
		return "pod"
	case c.IsPodGroup():
		return "PodGroup"
	case c.APIGroup == "":
		return c.Resource
	}
	return c.Resource + "." + c.APIGroup
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
	// UUID of the GPU or MIG device (of a MIG device created at Prepare,
	// once it exists); ParentUUID for MIG devices. The conflict checks
	// compare them.
	UUID       string `json:"uuid,omitempty"`
	ParentUUID string `json:"parentUUID,omitempty"`
	// CDIDeviceIDs handed to the kubelet for this device.
	CDIDeviceIDs []string `json:"cdiDeviceIDs,omitempty"`
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

// Clone returns a deep copy of c. Nil slices stay nil and empty ones
// empty: the checkpoint's encoder compares a claim with a copy of what it
// encoded, and encoding/json tells the two apart.
func (c *Claim) Clone() *Claim {
	out := *c
	out.Consumers = slices.Clone(c.Consumers)
	out.Devices = slices.Clone(c.Devices)
	for i := range out.Devices {
		d := &out.Devices[i]
		d.Requests = slices.Clone(d.Requests)
		d.CDIDeviceIDs = slices.Clone(d.CDIDeviceIDs)
	}
	out.Records = CloneRecords(c.Records)
	return &out
}

// CloneRecords returns a deep copy of a claim's records; nil stays nil.
func CloneRecords(records map[string]json.RawMessage) map[string]json.RawMessage {
	if records == nil {
		return nil
	}
	out := make(map[string]json.RawMessage, len(records))
	for name, rec := range records {
		out[name] = slices.Clone(rec)
	}
	return out
}

// RecordNames returns the names of the claim's records, sorted.
func (c *Claim) RecordNames() []string {
	return slices.Sorted(maps.Keys(c.Records))
}
