package mps_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/features/mps"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// TestGuardOneMPSClaimPerPod: a container reaches one MPS daemon, so a
// pod gets one MPS claim per node; other pods and non-MPS claims are fine.
func TestGuardOneMPSClaimPerPod(t *testing.T) {
	c := preparer.Adapt[mps.Record](mps.New(nil, "", false))
	rec := json.RawMessage(`{"daemons":[{"id":"x","devices":["gpu-0"]}]}`)
	s := claimstate.New()
	s.Claims["mps"] = &claimstate.Claim{UID: "mps", Consumers: []claimstate.Consumer{{Name: "pod", UID: "pod-1"}}, Records: map[string]json.RawMessage{mps.Name: rec}}
	s.Claims["plain"] = &claimstate.Claim{UID: "plain", Consumers: []claimstate.Consumer{{Name: "other", UID: "pod-2"}}}
	for _, tc := range []struct {
		pod     string
		refused bool
	}{
		{"pod-1", true},
		{"pod-2", false},
		{"pod-3", false},
	} {
		claim := &claimstate.Claim{UID: "new", Consumers: []claimstate.Consumer{{Name: tc.pod, UID: tc.pod}}}
		err := c.Guard(s, claim, rec)
		if got := errors.Is(err, mps.ErrMPSConsumer); got != tc.refused {
			t.Errorf("pod %s: Guard = %v, want refused %v", tc.pod, err, tc.refused)
		}
	}
}
