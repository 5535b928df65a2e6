package dynamicmig

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// Publisher offers the node's MIG-mode GPUs as dynamic MIG devices, or as
// the MIG devices that exist (static MIG).
type Publisher struct {
	// on says whether the node publishes dynamic MIG devices now: it stops
	// when the API server lacks partitionable devices.
	on atomic.Bool
	// switchable, if set, offers GPUs that can switch MIG mode at Prepare
	// both whole and as MIG devices.
	switchable func(hardware.GPU) bool
}

var (
	_ preparer.Publisher        = &Publisher{}
	_ preparer.FallbackProvider = &Publisher{}
)

// NewPublisher returns the publisher; dynamic says whether the node starts
// in dynamic mode, switchable (may be nil) which GPUs switch MIG mode.
func NewPublisher(dynamic bool, switchable func(hardware.GPU) bool) *Publisher {
	p := &Publisher{switchable: switchable}
	p.on.Store(dynamic)
	return p
}

// Dynamic reports whether dynamic MIG devices are published now.
func (p *Publisher) Dynamic() bool { return p.on.Load() }

// Publish implements [preparer.Publisher]. In dynamic mode, MIG instances
// whose ownership gpudra does not know (an operator's layout on a node
// migrated from another driver, or instances whose records were lost) are
// published as the static MIG devices they are: Prepare uses them and
// Unprepare never destroys them. The GPU then offers only the placements
// that overlap none of them, and its shared counters hold only what they
// leave, so that the scheduler can never hand out a placement that would
// collide with them. A GPU holding MIG devices discovery could not read
// (split compute instances, say) offers no placement at all: where those
// lie is unknown. When the checkpoint cannot be read (a newer plugin
// wrote it), ownership cannot be told either way; the instances are then
// taken as gpudra's, since every Prepare fails until that is fixed and
// calling them foreign would say something false.
func (p *Publisher) Publish(in *preparer.PublishInput) {
	if !p.on.Load() {
		return
	}
	in.Options = append(in.Options, devicemodel.WithDynamicMIG())
	if p.switchable != nil {
		in.Options = append(in.Options, devicemodel.WithMIGModeSwitching(p.switchable))
	}
	if in.State == nil {
		return
	}
	mine := owned(in.State)
	in.Options = append(in.Options, devicemodel.WithForeignMIGDevices(func(gpu *hardware.GPU, m *hardware.MIGDevice) bool {
		return !mine[hardware.MIGPlacement{ParentUUID: gpu.UUID, ProfileID: m.ProfileID, Start: m.PlacementStart}]
	}))
	foreign, unreadable := unknownInstances(in.Inventory, mine)
	if len(unreadable) > 0 {
		// Without profiles the device model publishes the GPU as static
		// MIG does: the MIG devices that could be read, and no placement.
		out := *in.Inventory
		out.GPUs = slices.Clone(in.Inventory.GPUs)
		for i := range out.GPUs {
			if _, ok := unreadable[out.GPUs[i].UUID]; ok {
				out.GPUs[i].MIGProfiles = nil
			}
		}
		in.Inventory = &out
		in.Notices = append(in.Notices, preparer.Notice{
			Reason: ReasonUnreadableMIG,
			Message: fmt.Sprintf("%d GPU(s) offer no dynamic MIG placement because they hold MIG devices discovery cannot read, whose memory slices are unknown (kept, never destroyed; the readable ones are published as static MIG devices): %s. "+
				"Destroy them (nvidia-smi mig -dci; nvidia-smi mig -dgi) to offer the placements again", len(unreadable), list(unreadable)),
		})
	}
	if len(foreign) > 0 {
		in.Notices = append(in.Notices, preparer.Notice{
			Reason: ReasonForeignMIG,
			Message: fmt.Sprintf("%d GPU(s) hold MIG devices gpudra did not create: they are published as static MIG devices (used as they are, never destroyed), "+
				"and only the dynamic MIG placements that overlap none of them are offered: %s. "+
				"Destroy them (nvidia-smi mig -dci; nvidia-smi mig -dgi) once no pod uses them to hand the whole GPU over to dynamic MIG",
				len(foreign), list(foreign)),
		})
	}
}

// Reasons of the notices (Node events) of GPUs whose MIG devices gpudra
// did not create.
const (
	// ReasonForeignMIG: the GPU holds MIG devices no record owns; they
	// are published as static MIG devices, and the placements that
	// overlap them are not offered.
	ReasonForeignMIG = "MIGOwnershipUnknown"
	// ReasonUnreadableMIG: the GPU holds MIG devices discovery cannot
	// read; it offers no placement.
	ReasonUnreadableMIG = "MIGDevicesUnreadable"
)

// list renders instances per GPU UUID.
func list(byGPU map[string][]string) string {
	uuids := slices.Sorted(maps.Keys(byGPU))
	msgs := make([]string, 0, len(uuids))
	for _, uuid := range uuids {
		msgs = append(msgs, fmt.Sprintf("%s: %s", uuid, strings.Join(byGPU[uuid], ", ")))
	}
	return strings.Join(msgs, "; ")
}

// Fallbacks implements [preparer.FallbackProvider].
func (p *Publisher) Fallbacks() []preparer.Fallback {
	return []preparer.Fallback{{
		Feature: "DRAPartitionableDevices", On: &p.on,
		Log:    "The API server lacks partitionable devices (DRAPartitionableDevices): falling back to static MIG, publishing the MIG devices that exist",
		Reason: "DynamicMIGUnavailable",
		Event:  "The API server dropped the shared counters of the dynamic MIG devices (DRAPartitionableDevices off): gpudra falls back to static MIG and publishes the MIG devices that exist",
	}}
}

// owned are the placements the records say gpudra created or is about to.
func owned(s *claimstate.State) map[hardware.MIGPlacement]bool {
	out := map[hardware.MIGPlacement]bool{}
	for _, c := range s.Claims {
		rec, err := codec.Of(c)
		if err != nil || rec == nil {
			continue
		}
		for i := range rec.Devices {
			out[rec.Devices[i].placement()] = true
		}
	}
	return out
}

// unknownInstances returns, per GPU UUID, the MIG devices on GPUs with
// MIG mode on whose ownership gpudra does not know (foreign), and those
// discovery could not read (unreadable).
func unknownInstances(inv *hardware.Inventory, owned map[hardware.MIGPlacement]bool) (foreign, unreadable map[string][]string) {
	foreign, unreadable = map[string][]string{}, map[string][]string{}
	for _, p := range inv.Problems {
		if p.MIGDevice != "" && p.UUID != "" {
			unreadable[p.UUID] = append(unreadable[p.UUID], fmt.Sprintf("%s (unreadable: %s)", p.MIGDevice, p.Err))
		}
	}
	for gi := range inv.GPUs {
		gpu := &inv.GPUs[gi]
		if !gpu.MIGEnabled {
			continue
		}
		for mi := range gpu.MIGDevices {
			m := &gpu.MIGDevices[mi]
			if !owned[hardware.MIGPlacement{ParentUUID: gpu.UUID, ProfileID: m.ProfileID, Start: m.PlacementStart}] {
				foreign[gpu.UUID] = append(foreign[gpu.UUID], fmt.Sprintf("%s at %d (%s)", m.Profile, m.PlacementStart, m.UUID))
			}
		}
	}
	return foreign, unreadable
}
