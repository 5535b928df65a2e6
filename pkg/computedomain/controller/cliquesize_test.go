package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/computedomain"
	"github.com/gpudra/gpudra/pkg/devicemodel"
)

func TestFitsInClique(t *testing.T) {
	slice := func(node, clique string) *resourceapi.ResourceSlice {
		return &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: node + "-cd"},
			Spec: resourceapi.ResourceSliceSpec{Driver: "compute-domain.nvidia.com", NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
				Devices: []resourceapi.Device{{Name: "channel-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{devicemodel.AttrCliqueID: {StringValue: ptr.To(clique)}}}}},
		}
	}
	tests := []struct {
		name       string
		numNodes   int
		wantStatus metav1.ConditionStatus // "" for no condition
		wantMsg    []string
	}{
		{name: "no node count", numNodes: 0},
		{name: "fits the largest clique", numNodes: 4, wantStatus: metav1.ConditionTrue, wantMsg: []string{"clique c.1 (4 nodes)"}},
		{name: "larger than every clique", numNodes: 5, wantStatus: metav1.ConditionFalse, wantMsg: []string{"spec.numNodes 5", "largest NVLink clique", "4 nodes", "clique c.1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDomain("a", "a-channel", "")
			d.Spec.NumNodes = tc.numNodes
			_, ctx := ktesting.NewTestContext(t)
			kube := fake.NewClientset(slice("n1", "c.1"), slice("n2", "c.1"), slice("n3", "c.1"), slice("n4", "c.1"), slice("n5", "c.2"), slice("n6", "c.2"))
			dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
				map[schema.GroupVersionResource]string{computedomain.GVR: "ComputeDomainList"}, toUnstructured(t, d))
			h := &controllerHarness{t: t, ctx: ctx, kube: kube, dyn: dyn}
			h.c = New(Config{KubeClient: kube, DynamicClient: dyn, MaxChannels: 8, ChannelDriver: "compute-domain.nvidia.com"})
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			go h.c.sizes.informer.Run(ctx.Done())
			for !h.c.sizes.informer.HasSynced() {
				time.Sleep(10 * time.Millisecond)
			}
			if err := h.c.seed(ctx); err != nil {
				t.Fatal(err)
			}
			h.reconcile("a")
			cd := h.get("a")
			c := meta.FindStatusCondition(cd.Status.Conditions, ConditionFitsInClique)
			if tc.wantStatus == "" {
				if c != nil {
					t.Fatalf("condition %+v for a domain with no node count", c)
				}
				return
			}
			if c == nil || c.Status != tc.wantStatus {
				t.Fatalf("FitsInClique = %+v, want %s", c, tc.wantStatus)
			}
			for _, w := range tc.wantMsg {
				if !strings.Contains(c.Message, w) {
					t.Errorf("message %q does not say %q", c.Message, w)
				}
			}
			if tc.wantStatus == metav1.ConditionFalse && (c.Reason != ReasonLargerThanClique || cd.Status.Status != v1beta1.ComputeDomainStatusNotReady) {
				t.Errorf("reason %q, status %q; want %s and NotReady", c.Reason, cd.Status.Status, ReasonLargerThanClique)
			}
		})
	}
}
