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

// Publish implements [preparer.Publisher]. In dynamic mode a GPU holding
// MIG instances whose ownership gpudra does not know is left out: gpudra
// must not destroy an instance it did not create, nor offer placements
// that overlap it. MIG devices discovery could not read (split compute
// instances, say) are unknown too: they occupy memory slices the counters
// would otherwise call free. When the checkpoint cannot be read (a newer
// plugin wrote it), ownership cannot be told either way; the instances are
// then taken as gpudra's, since every Prepare fails until that is fixed
// and leaving the GPUs out would say something false.
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
	unknown := unknownInstances(in.Inventory, owned(in.State))
	if len(unknown) == 0 {
		return
	}
	out := *in.Inventory
	out.GPUs = nil
	for _, g := range in.Inventory.GPUs {
		if _, ok := unknown[g.UUID]; !ok {
			out.GPUs = append(out.GPUs, g)
		}
	}
	in.Inventory = &out
	uuids := slices.Sorted(maps.Keys(unknown))
	msgs := make([]string, 0, len(uuids))
	for _, uuid := range uuids {
		msgs = append(msgs, fmt.Sprintf("%s: %s", uuid, strings.Join(unknown[uuid], ", ")))
	}
	in.Notices = append(in.Notices, preparer.Notice{
		Reason: "MIGOwnershipUnknown",
		Message: fmt.Sprintf("%d GPU(s) left out of the dynamic MIG devices because they hold MIG instances gpudra did not create (kept, never destroyed): %s. "+
			"Destroy them (nvidia-smi mig -dci; nvidia-smi mig -dgi) to offer the GPU again, or run the node with --mig-mode=static to publish the existing layout",
			len(unknown), strings.Join(msgs, "; ")),
	})
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
		raw := c.Records[Name]
		if raw == nil {
			continue
		}
		rec, err := preparer.Record[Record](Name, raw)
		if err != nil {
			continue
		}
		for i := range rec.Devices {
			out[rec.Devices[i].placement()] = true
		}
	}
	return out
}

// unknownInstances returns, per GPU UUID, the MIG devices on GPUs with MIG
// mode on whose ownership gpudra does not know.
func unknownInstances(inv *hardware.Inventory, owned map[hardware.MIGPlacement]bool) map[string][]string {
	unknown := map[string][]string{}
	for _, p := range inv.Problems {
		if p.MIGDevice != "" && p.UUID != "" {
			unknown[p.UUID] = append(unknown[p.UUID], fmt.Sprintf("%s (unreadable: %s)", p.MIGDevice, p.Err))
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
				unknown[gpu.UUID] = append(unknown[gpu.UUID], fmt.Sprintf("%s at %d (%s)", m.Profile, m.PlacementStart, m.UUID))
			}
		}
	}
	return unknown
}
