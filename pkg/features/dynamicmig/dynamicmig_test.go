package dynamicmig_test

import (
	"encoding/json"
	"errors"
	"slices"
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
	c := preparer.Adapt[dynamicmig.Record](dynamicmig.New(nil, func() bool { return true }))
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

// TestPublishKeepsGPUsWithUnknownInstances: a GPU holding an instance no
// record owns stays published, that instance as a static MIG device and
// the placements overlapping it left out; one whose instances are all
// recorded offers them as placements; a GPU holding an instance discovery
// could not read offers no placement; with the records unreadable (nil
// state) every instance counts as gpudra's.
func TestPublishKeepsGPUsWithUnknownInstances(t *testing.T) {
	h100 := func(uuid string, minor int, migs ...hardware.MIGDevice) hardware.GPU {
		return hardware.GPU{UUID: uuid, Minor: minor, Index: minor, MIGCapable: true, MIGEnabled: true, MemoryBytes: 80 << 30, MIGMemorySlices: 8,
			MIGProfiles: []hardware.MIGProfile{
				{Name: "1g.10gb", ProfileID: 19, Slices: 1, MemoryBytes: 10 << 30, Multiprocessors: 16, PlacementSize: 1, PlacementStarts: []int{0, 1, 2, 3, 4, 5, 6}},
				{Name: "7g.80gb", ProfileID: 0, Slices: 7, MemoryBytes: 80 << 30, Multiprocessors: 132, PlacementSize: 8, PlacementStarts: []int{0}},
			},
			MIGDevices: migs}
	}
	oneG := func(uuid string, start int) hardware.MIGDevice {
		return hardware.MIGDevice{UUID: uuid, Profile: "1g.10gb", ProfileID: 19, PlacementStart: start, PlacementSize: 1, MemoryBytes: 10 << 30, Multiprocessors: 16}
	}
	inv := &hardware.Inventory{GPUs: []hardware.GPU{h100(parent, 0, oneG("MIG-1", 0)), h100("GPU-other", 1, oneG("MIG-2", 4))}}
	unreadable := &hardware.Inventory{GPUs: inv.GPUs, Problems: []hardware.Problem{{UUID: "GPU-other", MIGDevice: "GI 9", Err: "split compute instances"}}}
	recorded := claimstate.New()
	recorded.Claims["c"] = &claimstate.Claim{UID: "c", Records: map[string]json.RawMessage{dynamicmig.Name: record(t, dynamicmig.Instance{
		Device: "gpu-0-mig-1g10gb-19-0", ParentUUID: parent, Profile: "1g.10gb", ProfileID: 19, Start: 0, Size: 1})}}
	for _, tc := range []struct {
		name    string
		inv     *hardware.Inventory
		state   *claimstate.State
		static  []string // existing MIG devices published as static ones
		dynamic []string // placements offered, among the checked ones
		absent  []string
		reasons []string
	}{
		{
			name: "GPU 1's instance unknown", inv: inv, state: recorded,
			static:  []string{"gpu-1-mig-1g10gb-19-4"},
			dynamic: []string{"gpu-0-mig-1g10gb-19-0", "gpu-0-mig-7g80gb-0-0", "gpu-1-mig-1g10gb-19-3", "gpu-1-mig-1g10gb-19-5"},
			absent:  []string{"gpu-1-mig-7g80gb-0-0"},
			reasons: []string{dynamicmig.ReasonForeignMIG},
		},
		{
			name: "both unknown on a node with no claims", inv: inv, state: claimstate.New(),
			static:  []string{"gpu-0-mig-1g10gb-19-0", "gpu-1-mig-1g10gb-19-4"},
			dynamic: []string{"gpu-0-mig-1g10gb-19-1", "gpu-1-mig-1g10gb-19-0"},
			absent:  []string{"gpu-0-mig-7g80gb-0-0", "gpu-1-mig-7g80gb-0-0"},
			reasons: []string{dynamicmig.ReasonForeignMIG},
		},
		{
			name: "unreadable instance", inv: unreadable, state: recorded,
			static:  []string{"gpu-1-mig-1g10gb-19-4"},
			dynamic: []string{"gpu-0-mig-1g10gb-19-1"},
			absent:  []string{"gpu-1-mig-1g10gb-19-0", "gpu-1-mig-1g10gb-19-3"},
			reasons: []string{dynamicmig.ReasonUnreadableMIG, dynamicmig.ReasonForeignMIG},
		},
		{
			name: "records unreadable", inv: inv, state: nil,
			dynamic: []string{"gpu-0-mig-1g10gb-19-0", "gpu-1-mig-1g10gb-19-4", "gpu-1-mig-7g80gb-0-0"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub, err := preparer.Publish(nil, tc.inv, nil, tc.state, []preparer.Publisher{dynamicmig.NewPublisher(true, nil)})
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range tc.static {
				if d, ok := pub.Model.Lookup(name); !ok || d.Placement != nil || d.MIG == nil || d.API.Attributes["uuid"].StringValue == nil {
					t.Errorf("%s not published as a static MIG device", name)
				}
			}
			for _, name := range tc.dynamic {
				if d, ok := pub.Model.Lookup(name); !ok || d.Placement == nil {
					t.Errorf("placement %s not offered", name)
				}
			}
			for _, name := range tc.absent {
				if _, ok := pub.Model.Lookup(name); ok {
					t.Errorf("%s offered, though it overlaps an instance that is not gpudra's", name)
				}
			}
			var reasons []string
			for _, n := range pub.Notices {
				reasons = append(reasons, n.Reason)
			}
			if !slices.Equal(reasons, tc.reasons) {
				t.Errorf("notices %+v, want reasons %v", pub.Notices, tc.reasons)
			}
			if len(inv.GPUs[1].MIGProfiles) == 0 {
				t.Error("Publish modified its input inventory")
			}
		})
	}
}
