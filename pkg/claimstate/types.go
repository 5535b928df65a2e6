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
	// Records are what each device configurator (MIG, VFIO, sharing, ...)
	// set up for the claim, by configurator name, in the configurator's
	// own format: claimstate never looks inside. A started record names
	// what is about to be set up before anything is, so that a crash
	// midway never leaves hardware state that no record owns.
	Records map[string]json.RawMessage `json:"records,omitempty"`
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
