package apiserver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/internal/chaos/apiserver"
	"github.com/gpudra/gpudra/pkg/devicestatus"
)

func start(t *testing.T) (*apiserver.Server, kubernetes.Interface) {
	t.Helper()
	srv, err := apiserver.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	client, err := kubernetes.NewForConfig(apiserver.RESTConfig(srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	return srv, client
}

func TestCRUDAndErrors(t *testing.T) {
	ctx := context.Background()
	_, client := start(t)
	claims := client.ResourceV1().ResourceClaims("default")
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c"},
		Status:     resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}},
	}
	created, err := claims.Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if created.UID == "" || created.ResourceVersion == "" || created.Status.Allocation != nil {
		t.Errorf("created claim %+v: want a UID, a resource version and no status", created.ObjectMeta)
	}
	if _, err := claims.Create(ctx, claim, metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		t.Errorf("second create: %v, want AlreadyExists", err)
	}
	created.Status.Allocation = &resourceapi.AllocationResult{}
	updated, err := claims.UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil || updated.Status.Allocation == nil {
		t.Fatalf("UpdateStatus: %v, %+v", err, updated)
	}
	if _, err := claims.UpdateStatus(ctx, created, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Errorf("update with a stale resource version: %v, want Conflict", err)
	}
	if _, err := claims.Get(ctx, "nope", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("get of a missing claim: %v, want NotFound", err)
	}
	other := types.UID("other-uid")
	if err := claims.Delete(ctx, "c", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: ptr.To(other)}}); !apierrors.IsConflict(err) {
		t.Errorf("delete with a wrong UID: %v, want Conflict", err)
	}
	if err := claims.Delete(ctx, "c", metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
	// generateName and events, as the event recorder writes them.
	ev, err := client.CoreV1().Events("default").Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: "e-"}, Reason: "R"}, metav1.CreateOptions{})
	if err != nil || ev.Name == "" {
		t.Fatalf("create with generateName: %v, %q", err, ev.Name)
	}
}

// TestResourceSliceController runs the resourceslice controller (the
// kubeletplugin helper's) against the server: it publishes, watches
// (watch-list included) and repairs a slice someone else deleted.
func TestResourceSliceController(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, client := start(t)
	node, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var devices []resourceapi.Device
	for i := range 3 {
		devices = append(devices, resourceapi.Device{Name: fmt.Sprintf("gpu-%d", i)})
	}
	ctrl, err := resourceslice.StartController(ctx, resourceslice.Options{
		DriverName: "gpu.nvidia.com",
		KubeClient: client,
		Owner:      &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: node.Name},
		SyncDelay:  ptr.To(100 * time.Millisecond), // 30 s by default after a slice changes
		Resources: &resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
			"n": {Slices: []resourceslice.Slice{{Devices: devices}}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ctrl.Stop()
	published := func() int {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=n"})
		if err != nil || len(list.Items) != 1 {
			return 0
		}
		return len(list.Items[0].Spec.Devices)
	}
	waitFor(t, func() bool { return published() == 3 }, "the controller's slice")
	list, _ := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err := client.ResourceV1().ResourceSlices().Delete(ctx, list.Items[0].Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return published() == 3 }, "the slice published again after its deletion")
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// TestWatchFromResourceVersion replays what happened after a version.
func TestWatchFromResourceVersion(t *testing.T) {
	ctx := context.Background()
	_, client := start(t)
	nodes := client.CoreV1().Nodes()
	first, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "a"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "b"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := nodes.Watch(ctx, metav1.ListOptions{ResourceVersion: first.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if err := nodes.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		typ  watch.EventType
		name string
	}{{watch.Added, "b"}, {watch.Deleted, "a"}} {
		select {
		case ev := <-w.ResultChan():
			if n, ok := ev.Object.(*corev1.Node); ev.Type != want.typ || !ok || n.Name != want.name {
				t.Errorf("event %s %+v, want %s of %s", ev.Type, ev.Object, want.typ, want.name)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no %s event for %s", want.typ, want.name)
		}
	}
}

// TestDeviceStatusApply is gpudra's status writer against the server: its
// entries come and go, another driver's stay.
func TestDeviceStatusApply(t *testing.T) {
	ctx := context.Background()
	_, client := start(t)
	claims := client.ResourceV1().ResourceClaims("default")
	claim, err := claims.Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim.Status = resourceapi.ResourceClaimStatus{
		Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: "r", Driver: "gpu.nvidia.com", Pool: "n", Device: "gpu-0"},
			{Request: "r", Driver: "other.example.com", Pool: "n", Device: "x"},
		}}},
		Devices: []resourceapi.AllocatedDeviceStatus{{Driver: "other.example.com", Pool: "n", Device: "x"}},
	}
	if claim, err = claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := devicestatus.NewWriter(client, "gpu.nvidia.com", "n")
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Record(ctx, claim, []devicestatus.Device{{Pool: "n", Name: "gpu-0", UUID: "GPU-1"}}); err != nil {
		t.Fatal(err)
	}
	got, _ := claims.Get(ctx, "c", metav1.GetOptions{})
	if len(got.Status.Devices) != 2 {
		t.Fatalf("status.devices after Record: %+v", got.Status.Devices)
	}
	if err := w.Remove(ctx, kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}, UID: claim.UID}); err != nil {
		t.Fatal(err)
	}
	got, _ = claims.Get(ctx, "c", metav1.GetOptions{})
	if len(got.Status.Devices) != 1 || got.Status.Devices[0].Driver != "other.example.com" {
		t.Errorf("status.devices after Remove: %+v, want the other driver's entry alone", got.Status.Devices)
	}
}

// TestDryRunCreate: a dry-run create answers what it would store and
// stores nothing, as the kubelet plugin's feature probe expects.
func TestDryRunCreate(t *testing.T) {
	ctx := context.Background()
	_, client := start(t)
	nodes := client.CoreV1().Nodes()
	got, err := nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-"}}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil || got.Name == "" {
		t.Fatalf("dry-run create: %+v, %v; want the object with its generated name", got, err)
	}
	list, err := nodes.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 0 {
		t.Errorf("after a dry-run create: %d nodes, %v; want none stored", len(list.Items), err)
	}
}
