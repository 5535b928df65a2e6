package dynamicmig_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/features/dynamicmig"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
)

const parent = "GPU-0b5c1a52-7c1e-4a47-9b0e-3b8e0f1d2c3a"

func record(t *testing.T, instances ...dynamicmig.Instance) json.RawMessage {
	t.Helper()
	raw, err := json.Marshal(dynamicmig.Record{Devices: instances})
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

func at(name string, start, size int) dynamicmig.Instance {
	return dynamicmig.Instance{Device: name, ParentUUID: parent, Profile: "p", ProfileID: 1, Start: start, Size: size}
}

// TestGuardRefusesOverlappingPlacements: the driver is the last guard
// against two claims' MIG devices sharing a memory slice of one GPU.
func TestGuardRefusesOverlappingPlacements(t *testing.T) {
	c := dynamicmig.New(nil, func() bool { return true })
	held := &claimstate.Claim{UID: "held", Namespace: "ns", Name: "held", Records: map[string]json.RawMessage{dynamicmig.Name: record(t, at("a", 0, 2))}}
	s := claimstate.New()
	s.Claims["held"] = held
	claim := &claimstate.Claim{UID: "new", Devices: []claimstate.Device{{Pool: "node", Name: "b"}}}
	for _, tc := range []struct {
		name      string
		inst      dynamicmig.Instance
		conflicts bool
	}{
		{"same start", at("b", 0, 1), true},
		{"inside", at("b", 1, 1), true},
		{"adjacent", at("b", 2, 2), false},
		{"other GPU", dynamicmig.Instance{Device: "b", ParentUUID: "GPU-other", Start: 0, Size: 2}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := c.Guard(s, claim, record(t, tc.inst))
			var conflict *claimstate.ConflictError
			if got := errors.As(err, &conflict); got != tc.conflicts {
				t.Errorf("Guard = %v, want conflict %v", err, tc.conflicts)
			}
		})
	}
	if err := c.Guard(s, claim, json.RawMessage(`{"devices":"no"}`)); err == nil {
		t.Error("Guard accepted an unreadable record")
	}
}

// TestPublishLeavesOutGPUsWithUnknownInstances: a GPU holding an instance
// no record owns is left out; one whose instances are all recorded stays;
// with the records unreadable (nil state) nothing is left out.
func TestPublishLeavesOutGPUsWithUnknownInstances(t *testing.T) {
	inv := &hardware.Inventory{GPUs: []hardware.GPU{
		{UUID: parent, MIGEnabled: true, MIGDevices: []hardware.MIGDevice{{UUID: "MIG-1", Profile: "p", ProfileID: 1, PlacementStart: 0}}},
		{UUID: "GPU-other", MIGEnabled: true, MIGDevices: []hardware.MIGDevice{{UUID: "MIG-2", Profile: "p", ProfileID: 1, PlacementStart: 4}}},
	}}
	s := claimstate.New()
	s.Claims["c"] = &claimstate.Claim{UID: "c", Records: map[string]json.RawMessage{dynamicmig.Name: record(t, at("a", 0, 1))}}
	p := dynamicmig.NewPublisher(true, nil)

	in := &preparer.PublishInput{Inventory: inv, State: s}
	p.Publish(in)
	if len(in.Inventory.GPUs) != 1 || in.Inventory.GPUs[0].UUID != parent {
		t.Errorf("published GPUs %+v, want only %s", in.Inventory.GPUs, parent)
	}
	if len(in.Notices) != 1 || !strings.Contains(in.Notices[0].Message, "MIG-2") {
		t.Errorf("notices %+v, want one naming MIG-2", in.Notices)
	}
	if len(inv.GPUs) != 2 {
		t.Error("Publish modified its input inventory")
	}

	in = &preparer.PublishInput{Inventory: inv}
	p.Publish(in)
	if len(in.Inventory.GPUs) != 2 || len(in.Notices) != 0 {
		t.Errorf("with unreadable records: GPUs %d, notices %+v; want both GPUs and no notice", len(in.Inventory.GPUs), in.Notices)
	}
}
