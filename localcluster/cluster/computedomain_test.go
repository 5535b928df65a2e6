package cluster

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

func TestNotReadyReason(t *testing.T) {
	ready, notReady := v1beta1.ComputeDomainStatusReady, v1beta1.ComputeDomainStatusNotReady
	for _, tc := range []struct {
		name string
		cd   v1beta1.ComputeDomain
		want string
	}{
		{name: "ready", cd: v1beta1.ComputeDomain{Status: v1beta1.ComputeDomainStatus{Status: ready}}},
		{name: "nodes missing", want: "1 of 4 nodes ready", cd: v1beta1.ComputeDomain{
			Spec:   v1beta1.ComputeDomainSpec{NumNodes: 4},
			Status: v1beta1.ComputeDomainStatus{Status: notReady, Nodes: []*v1beta1.ComputeDomainNode{{Name: "a", Status: ready}, {Name: "b", Status: notReady}}},
		}},
		{name: "a condition says why", want: "InvalidNumNodes: numNodes 9 is more than the clique has", cd: v1beta1.ComputeDomain{
			Spec: v1beta1.ComputeDomainSpec{NumNodes: 9},
			Status: v1beta1.ComputeDomainStatus{Status: notReady, Conditions: []metav1.Condition{
				{Type: "Valid", Status: metav1.ConditionFalse, Reason: "InvalidNumNodes", Message: "numNodes 9 is more than the clique has"},
				{Type: "Other", Status: metav1.ConditionTrue, Reason: "Fine"},
			}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := notReadyReason(&tc.cd); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
