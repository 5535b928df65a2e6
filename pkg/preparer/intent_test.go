package preparer_test

import (
	"reflect"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// TestConsumersOf: a claim reserved for a PodGroup (KEP-5729) has that
// PodGroup as its consumer, not no consumer at all; pods keep reading as
// before.
func TestConsumersOf(t *testing.T) {
	for _, tc := range []struct {
		name     string
		reserved []resourceapi.ResourceClaimConsumerReference
		want     []claimstate.Consumer
	}{
		{name: "none"},
		{
			name:     "pods",
			reserved: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "a", UID: "ua"}, {Resource: "pods", Name: "b", UID: "ub"}},
			want:     []claimstate.Consumer{{Name: "a", UID: "ua"}, {Name: "b", UID: "ub"}},
		},
		{
			name:     "PodGroup",
			reserved: []resourceapi.ResourceClaimConsumerReference{{APIGroup: "scheduling.k8s.io", Resource: "podgroups", Name: "trainers", UID: "pg"}},
			want:     []claimstate.Consumer{{APIGroup: "scheduling.k8s.io", Resource: "podgroups", Name: "trainers", UID: "pg"}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := &resourceapi.ResourceClaim{Status: resourceapi.ResourceClaimStatus{ReservedFor: tc.reserved}}
			got := preparer.ConsumersOf(claim)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ConsumersOf = %+v, want %+v", got, tc.want)
			}
			for _, c := range got {
				if tc.name == "PodGroup" && !c.IsPodGroup() {
					t.Errorf("%+v is not a PodGroup", c)
				}
			}
		})
	}
}
