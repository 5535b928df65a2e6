package mps_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/features/mps"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// TestGuardOneMPSClaimPerPod: a container reaches one MPS daemon, so a
// pod, or a PodGroup whose pods share its claims, gets one MPS claim per
// node; other consumers and non-MPS claims are fine.
func TestGuardOneMPSClaimPerPod(t *testing.T) {
	c := preparer.Adapt[mps.Record](mps.New(nil, "", false))
	rec := json.RawMessage(`{"daemons":[{"id":"x","devices":["gpu-0"]}]}`)
	s := claimstate.New()
	s.Claims["mps"] = &claimstate.Claim{UID: "mps", Consumers: []claimstate.Consumer{{Name: "pod", UID: "pod-1"}}, Records: map[string]json.RawMessage{mps.Name: rec}}
	s.Claims["plain"] = &claimstate.Claim{UID: "plain", Consumers: []claimstate.Consumer{{Name: "other", UID: "pod-2"}}}
	group := claimstate.NewConsumer(claimstate.PodGroupAPIGroup, claimstate.PodGroupResource, "trainers", "pg-1")
	s.Claims["group"] = &claimstate.Claim{UID: "group", Namespace: "ns", Name: "group-mps", Consumers: []claimstate.Consumer{group}, Records: map[string]json.RawMessage{mps.Name: rec}}
	for _, tc := range []struct {
		consumer claimstate.Consumer
		refused  string // what the refusal names; "" if none
	}{
		{claimstate.PodConsumer("pod", "pod-1"), "pod ns/pod already uses MPS claim"},
		{claimstate.PodConsumer("other", "pod-2"), ""},
		{claimstate.PodConsumer("third", "pod-3"), ""},
		{group, "PodGroup ns/trainers already uses MPS claim ns/group-mps"},
		{claimstate.NewConsumer(claimstate.PodGroupAPIGroup, claimstate.PodGroupResource, "others", "pg-2"), ""},
	} {
		claim := &claimstate.Claim{UID: "new", Namespace: "ns", Consumers: []claimstate.Consumer{tc.consumer}}
		err := c.Guard(s, claim, rec)
		if got := errors.Is(err, mps.ErrMPSConsumer); got != (tc.refused != "") || (err != nil && !strings.Contains(err.Error(), tc.refused)) {
			t.Errorf("%s %s: Guard = %v, want refused naming %q", tc.consumer.Kind(), tc.consumer.Name, err, tc.refused)
		}
	}
}
