package claimstate

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// Intent is what one Prepare asks for: a claim and its allocated devices.
type Intent struct {
	UID       string
	Namespace string
	Name      string
	Consumers []Consumer
	Devices   []Device
	// Records are the configurators' records of the preparation (see
	// [Claim.Records]).
	Records map[string]json.RawMessage
}

// PrepareAction is what Prepare must do for a claim, given the state.
type PrepareAction int

const (
	// ActionPrepare sets the claim up from scratch.
	ActionPrepare PrepareAction = iota
	// ActionRollbackThenPrepare first undoes the partial work of an earlier,
	// interrupted preparation, then sets the claim up.
	ActionRollbackThenPrepare
	// ActionReturnRecorded returns the recorded result of a completed
	// preparation: Prepare is idempotent.
	ActionReturnRecorded
)

func (a PrepareAction) String() string {
	switch a {
	case ActionPrepare:
		return "Prepare"
	case ActionRollbackThenPrepare:
		return "RollbackThenPrepare"
	case ActionReturnRecorded:
		return "ReturnRecorded"
	}
	return fmt.Sprintf("PrepareAction(%d)", int(a))
}

// ConflictError says a device is held by another prepared claim.
type ConflictError struct {
	Device string
	Holder *Claim
}

func (e *ConflictError) Error() string {
	holder := fmt.Sprintf("%s/%s (uid %s)", e.Holder.Namespace, e.Holder.Name, e.Holder.UID)
	if e.Holder.Name == "" {
		holder = fmt.Sprintf("uid %s (adopted from a lost checkpoint's CDI specs or from NVIDIA's DRA driver; its name is not known until the sweep finds the claim)", e.Holder.UID)
	}
	return fmt.Sprintf("device %s is already prepared for claim %s; a device goes to one claim at a time unless allocated with admin access or as a share",
		e.Device, holder)
}

// PlanPrepare decides what Prepare must do for the intent. It returns the
// existing record (nil if none) so that the caller can roll back its
// partial work or return its result.
func (s *State) PlanPrepare(in Intent) (PrepareAction, *Claim, error) {
	existing := s.Claims[in.UID]
	if existing != nil && existing.Adopted {
		// An adopted record knows the devices but not the requests, shares
		// or admin access: prepare again over it (the spec is rewritten in
		// place) and let the full record replace it.
		if err := s.checkConflicts(in); err != nil {
			return 0, existing, err
		}
		return ActionPrepare, existing, nil
	}
	if existing != nil && existing.Phase == PrepareCompleted {
		if !sameDevices(existing.Devices, in.Devices) {
			return 0, existing, fmt.Errorf("claim %s/%s (uid %s) is already prepared with devices %v, not %v: unprepare it first",
				in.Namespace, in.Name, in.UID, deviceKeys(existing.Devices), deviceKeys(in.Devices))
		}
		return ActionReturnRecorded, existing, nil
	}
	if err := s.checkConflicts(in); err != nil {
		return 0, existing, err
	}
	if existing != nil {
		return ActionRollbackThenPrepare, existing, nil
	}
	return ActionPrepare, nil, nil
}

// RecordStarted records that preparation of the intent began. It checks
// for conflicts again, because it may run on fresher state than the plan.
func (s *State) RecordStarted(in Intent, now time.Time) error {
	if err := s.checkConflicts(in); err != nil {
		return err
	}
	s.Claims[in.UID] = in.Claim(PrepareStarted, now)
	return nil
}

// RecordCompleted records that every device of the intent is set up. The
// intent's devices carry their CDI device IDs by now.
func (s *State) RecordCompleted(in Intent, startedAt time.Time) error {
	if existing := s.Claims[in.UID]; existing != nil && existing.Phase == PrepareCompleted && !existing.Adopted {
		if sameDevices(existing.Devices, in.Devices) {
			return nil
		}
		return fmt.Errorf("claim %s/%s (uid %s) was completed concurrently with other devices", in.Namespace, in.Name, in.UID)
	}
	if err := s.checkConflicts(in); err != nil {
		return err
	}
	s.Claims[in.UID] = in.Claim(PrepareCompleted, startedAt)
	return nil
}

// Remove forgets the claim; removing an unknown claim is a no-op.
func (s *State) Remove(uid string) {
	delete(s.Claims, uid)
}

// SweepPlan is what the background sweep should do.
type SweepPlan struct {
	// RollBack are started preparations older than the kubelet's call
	// timeout: their caller has given up, so their partial work is undone.
	RollBack []*Claim
	// Release are completed claims whose claim object and consumer pods
	// are all gone: the kubelet will never unprepare them.
	Release []*Claim
}

// PlanSweep picks the stale entries. gone reports whether a completed
// claim and all its consumers are gone from the API server; it is asked
// only for completed entries.
func (s *State) PlanSweep(now time.Time, startedTimeout time.Duration, gone func(*Claim) bool) SweepPlan {
	var plan SweepPlan
	for _, uid := range s.sortedUIDs() {
		c := s.Claims[uid]
		switch c.Phase {
		case PrepareStarted:
			if now.Sub(c.StartedAt) > startedTimeout {
				plan.RollBack = append(plan.RollBack, c.Clone())
			}
		case PrepareCompleted:
			if gone(c) {
				plan.Release = append(plan.Release, c.Clone())
			}
		}
	}
	return plan
}

// sortedUIDs gives a stable iteration order, so errors and plans are deterministic.
func (s *State) sortedUIDs() []string {
	uids := make([]string, 0, len(s.Claims))
	for uid := range s.Claims {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	return uids
}

// CheckConflicts returns the error the intent's start or completion record
// would be refused with because of its devices, without recording
// anything: a claim that gets no start record is checked before its CDI
// spec names the devices.
func (s *State) CheckConflicts(in Intent) error { return s.checkConflicts(in) }

// checkConflicts refuses an intent that wants a device exclusively while
// another claim holds it, or wants a share of a device another claim holds
// exclusively, or that holds one piece of hardware twice under two names
// (a GPU and its VFIO device, a GPU and a MIG device on it): the container
// would get a GPU that is passed through, or two claims' worth of one GPU.
// Admin-access results never conflict. Devices are the same when their
// names are, and, where both records know the hardware, when they are the
// same GPU or MIG device or one is a MIG device of the other: a name alone
// would miss a full GPU and a MIG device on it, or a GPU whose minor number
// changed. Pools are compared as recorded; records migrated from a schema
// without pools get this node's pool when they are read.
func (s *State) checkConflicts(in Intent) error {
	for i, want := range in.Devices {
		if want.AdminAccess {
			continue
		}
		for _, other := range in.Devices[:i] {
			if other.AdminAccess || (other.Pool == want.Pool && other.Name == want.Name) || !overlaps(want, other) {
				continue
			}
			if want.ShareID != "" && other.ShareID != "" {
				continue
			}
			return &SelfConflictError{Claim: in.Namespace + "/" + in.Name, UID: in.UID, Device: want.Pool + "/" + want.Name, Other: other.Pool + "/" + other.Name}
		}
		for _, uid := range s.sortedUIDs() {
			if uid == in.UID {
				continue
			}
			holder := s.Claims[uid]
			for _, held := range holder.Devices {
				if held.AdminAccess || !overlaps(want, held) {
					continue
				}
				if want.ShareID != "" && held.ShareID != "" {
					continue
				}
				return &ConflictError{Device: want.Pool + "/" + want.Name, Holder: holder}
			}
		}
	}
	return nil
}

// SelfConflictError refuses a claim that holds one piece of hardware under
// two device names.
type SelfConflictError struct {
	Claim, UID    string
	Device, Other string
}

func (e *SelfConflictError) Error() string {
	return fmt.Sprintf("claim %s (uid %s) was allocated both %s and %s, which are the same GPU (or a GPU and a MIG device on it): a GPU goes to a claim one way at a time (whole, as MIG devices, or passed through with VFIO); ask for one of them",
		e.Claim, e.UID, e.Device, e.Other)
}

// overlaps reports whether two devices share hardware: the same name, the
// same GPU or MIG device, or a GPU and a MIG device on it. A MIG device
// created at Prepare has no UUID before it exists, but its parent is always
// known; whether two such placements overlap is the MIG configurator's
// guard to decide, since only its records know the placements.
func overlaps(a, b Device) bool {
	if a.Pool == b.Pool && a.Name == b.Name {
		return true
	}
	if a.UUID != "" && a.UUID == b.UUID {
		return true
	}
	return (a.UUID != "" && b.ParentUUID == a.UUID) || (b.UUID != "" && a.ParentUUID == b.UUID)
}

// Claim is the record of the intent in phase, started (or, completed,
// finished) at startedAt; it shares nothing with the intent.
func (in Intent) Claim(phase Phase, startedAt time.Time) *Claim {
	c := &Claim{
		UID:       in.UID,
		Namespace: in.Namespace,
		Name:      in.Name,
		Phase:     phase,
		StartedAt: startedAt,
		Consumers: in.Consumers,
		Devices:   in.Devices,
		Records:   in.Records,
	}
	return c.Clone()
}

// sameDevices compares allocations by identity (pool, name, share, admin
// access, requests), not by the CDI IDs that preparation adds.
func sameDevices(a, b []Device) bool {
	return slices.Equal(deviceKeys(a), deviceKeys(b))
}

func deviceKeys(ds []Device) []string {
	keys := make([]string, len(ds))
	for i, d := range ds {
		keys[i] = fmt.Sprintf("%s/%s", d.Pool, d.Name)
		if d.ShareID != "" {
			keys[i] += "@" + d.ShareID
		}
		if d.AdminAccess {
			keys[i] += "(admin)"
		}
	}
	return keys
}

// Adopt records a claim found prepared on the node without a record (its
// CDI spec survived the loss of the checkpoint) as completed and adopted.
// It never replaces an existing record, and reports whether it added one.
func (s *State) Adopt(uid string, devices []Device, records map[string]json.RawMessage, now time.Time) bool {
	if _, ok := s.Claims[uid]; ok {
		return false
	}
	c := &Claim{UID: uid, Phase: PrepareCompleted, StartedAt: now, Devices: devices, Records: records, Adopted: true}
	s.Claims[uid] = c.Clone()
	return true
}
