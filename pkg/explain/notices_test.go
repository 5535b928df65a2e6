package explain

import (
	"context"
	"reflect"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpudra/gpudra/pkg/features/dynamicmig"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// TestNodeNoticesAreShown: the reason a node's kubelet plugin offers
// fewer devices (an operator's MIG layout on a migrated node) is in the
// report: the latest Node event of each node and reason, and no other
// event.
func TestNodeNoticesAreShown(t *testing.T) {
	for _, reason := range []string{dynamicmig.ReasonForeignMIG, dynamicmig.ReasonUnreadableMIG} {
		if !slices.Contains(NoticeReasons, reason) {
			t.Errorf("NoticeReasons lacks the plugin's %s", reason)
		}
	}
	event := func(name, node, reason, msg string, at time.Time) *corev1.Event {
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: node}, Reason: reason, Message: msg,
			LastTimestamp: metav1.NewTime(at)}
	}
	now := time.Now()
	objs, _ := fleetSlices(t, "dgx-h100")
	objs = append(objs, podWithTemplate("default", "two", gpus("gpus", "gpu.nvidia.com", 2))...)
	objs = append(objs, []runtime.Object{
		event("old", "dgx-h100-0", dynamicmig.ReasonForeignMIG, "an older layout", now.Add(-time.Hour)),
		event("new", "dgx-h100-0", dynamicmig.ReasonForeignMIG, "GPU-1: 1g.10gb at 0", now),
		event("other", "dgx-h100-0", "NodeReady", "ready", now),
	}...)
	// The plugin's Warning events are notices whatever their reason (a
	// fallback on an API server without a feature); its Normal ones (an
	// expected absence) and other components' Warnings are not.
	fromPlugin := func(name, reason, typ string) *corev1.Event {
		e := event(name, "dgx-h100-1", reason, reason+" message", now)
		e.Source.Component, e.Type = preparer.EventComponent, typ
		return e
	}
	kubelet := event("kubelet", "dgx-h100-1", "Rebooted", "rebooted", now)
	kubelet.Type, kubelet.Source.Component = corev1.EventTypeWarning, "kubelet"
	objs = append(objs, fromPlugin("fallback", "DynamicMIGUnavailable", corev1.EventTypeWarning),
		fromPlugin("expected", "NoNVLinkFabric", corev1.EventTypeNormal), kubelet)
	rep, err := Explain(context.Background(), fake.NewClientset(objs...), pod("two"))
	if err != nil {
		t.Fatal(err)
	}
	want := []NodeNotice{
		{Node: "dgx-h100-0", Reason: dynamicmig.ReasonForeignMIG, Message: "GPU-1: 1g.10gb at 0"},
		{Node: "dgx-h100-1", Reason: "DynamicMIGUnavailable", Message: "DynamicMIGUnavailable message"},
	}
	if !reflect.DeepEqual(rep.Notices, want) {
		t.Errorf("notices %+v, want %+v", rep.Notices, want)
	}
	mustContain(t, Text(rep), "  node dgx-h100-0 offers fewer devices (MIGOwnershipUnknown): GPU-1: 1g.10gb at 0\n")
}
