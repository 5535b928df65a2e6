package versionskew

import (
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// TestHeldTwice checks the checkpoint check itself on made-up states.
func TestHeldTwice(t *testing.T) {
	claim := func(name string, devs ...claimstate.Device) *claimstate.Claim {
		return &claimstate.Claim{UID: name, Namespace: "ns", Name: name, Devices: devs}
	}
	gpu := func(uuid string) claimstate.Device { return claimstate.Device{Name: "gpu", UUID: uuid} }
	mig := func(uuid, parent string) claimstate.Device {
		return claimstate.Device{Name: "mig", UUID: uuid, ParentUUID: parent}
	}
	share := func(uuid, id string) claimstate.Device {
		return claimstate.Device{Name: "gpu", UUID: uuid, ShareID: id}
	}
	for _, tc := range []struct {
		name   string
		claims []*claimstate.Claim
		want   string
	}{
		{"distinct GPUs", []*claimstate.Claim{claim("a", gpu("G1")), claim("b", gpu("G2"))}, ""},
		{"one GPU twice", []*claimstate.Claim{claim("a", gpu("G1")), claim("b", gpu("G1"))}, "prepared for claims ns/a and ns/b"},
		{"two MIG devices of a GPU", []*claimstate.Claim{claim("a", mig("M1", "G1")), claim("b", mig("M2", "G1"))}, ""},
		{"one MIG device twice", []*claimstate.Claim{claim("a", mig("M1", "G1")), claim("b", mig("M1", "G1"))}, "prepared for claims"},
		{"GPU and a MIG device of it", []*claimstate.Claim{claim("a", gpu("G1")), claim("b", mig("M1", "G1"))}, "prepared whole for claim ns/a while claim ns/b"},
		{"shares of a GPU", []*claimstate.Claim{claim("a", share("G1", "s1")), claim("b", share("G1", "s2"))}, ""},
		{"GPU and a share of it", []*claimstate.Claim{claim("a", gpu("G1")), claim("b", share("G1", "s1"))}, "prepared whole"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := claimstate.New()
			for _, c := range tc.claims {
				st.Claims[c.UID] = c
			}
			err := heldTwice(st)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("got %v, want %q", err, tc.want)
			}
		})
	}
}
