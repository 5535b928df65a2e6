package explain

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/deployments/deviceclasses"
	"github.com/gpudra/gpudra/pkg/features"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/inspect"
	"github.com/gpudra/gpudra/pkg/preparer"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

const driver = "gpu.nvidia.com"

// fleetSlices returns the ResourceSlices the kubelet plugin publishes for
// every node of the built-in fleets, built by the plugin's own publishing
// code as `gpudra inspect` builds them, and a Node object for each.
func fleetSlices(t *testing.T, fleets ...string) ([]runtime.Object, []string) {
	t.Helper()
	var objs []runtime.Object
	var names []string
	for _, name := range fleets {
		fleet, err := simfleet.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, nodeName := range fleet.NodeNames() {
			n, err := fleet.Node(nodeName)
			if err != nil {
				t.Fatal(err)
			}
			hw := n.Hardware()
			inv, err := hw.Discover(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			fo := features.Options{DynamicMIG: n.MIGMode != "static"}
			fo.MIG, _ = hw.(hardware.MIGManager)
			set, err := features.New(fo)
			if err != nil {
				t.Fatal(err)
			}
			pub, err := preparer.Publish(set.Build, inv, nil, nil, set.Publishers)
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range inspect.ResourceSlices(driver, inspect.Node{Name: nodeName, Inventory: pub.Inventory, Model: pub.Model}) {
				objs = append(objs, &s)
			}
			objs = append(objs, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{corev1.LabelHostname: nodeName}}})
			names = append(names, nodeName)
		}
	}
	classes, err := deviceclasses.All()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range classes {
		objs = append(objs, c)
	}
	return objs, names
}

// gpus is an exact request for count devices of a class.
func gpus(name, class string, count int64, selectors ...string) resourceapi.DeviceRequest {
	r := &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}
	for _, s := range selectors {
		r.Selectors = append(r.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	return resourceapi.DeviceRequest{Name: name, Exactly: r}
}

// podWithTemplate is a pending pod whose one claim comes from a template
// that no controller has turned into a claim yet.
func podWithTemplate(ns, name string, requests ...resourceapi.DeviceRequest) []runtime.Object {
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-tmpl"},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests}}},
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(name + "-uid")},
		Spec: corev1.PodSpec{
			Containers:     []corev1.Container{{Name: "ctr", Image: "ubuntu:24.04", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(tmpl.Name)}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{
			Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable",
			Message: "0/2 nodes are available: 2 cannot allocate all claims.",
		}}},
	}
	return []runtime.Object{tmpl, pod}
}

// heldClaim is a claim of another pod, allocated the devices of one node.
func heldClaim(ns, name, node string, devices ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(name)}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: driver, Pool: node, Device: d})
	}
	return c
}

func quantity(s string) resource.Quantity { return resource.MustParse(s) }

// explain runs the explanation against a fake clientset holding objs and
// checks that it only read.
func explain(t *testing.T, target Target, objs ...runtime.Object) (*Report, error) {
	t.Helper()
	client := fake.NewClientset(objs...)
	rep, err := Explain(context.Background(), client, target)
	for _, a := range client.Actions() {
		if v := a.GetVerb(); v != "get" && v != "list" {
			t.Errorf("explain did %s %s: it must only read", v, a.GetResource().Resource)
		}
	}
	return rep, err
}

func pod(name string) Target { return Target{Kind: KindPod, Namespace: "default", Name: name} }

// mustContain fails unless text contains every want.
func mustContain(t *testing.T, text string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("missing %q in:\n%s", w, text)
		}
	}
}
