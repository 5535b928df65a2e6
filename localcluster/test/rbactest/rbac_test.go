// Package rbactest checks the RBAC gpudra ships (deployments/rbac) against
// a real kube-apiserver with Node,RBAC authorization, with the kubelet
// plugin's ServiceAccount impersonated as its pods' bound tokens present it
// (groups, and the node in the user extra): it may write device status
// (pkg/devicestatus) on claims allocated on its own node and on nothing
// else, and the plugin runs a pod's claim through prepare and unprepare
// without one refused request.
package rbactest

import (
	"context"
	"flag"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/deployments/rbac"
	"github.com/gpudra/gpudra/pkg/devicestatus"

	"github.com/gpudra/gpudra/localcluster/controlplane"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

const (
	driver     = rbac.DefaultDriverName
	otherDrv   = "nic.example.com"
	pluginNS   = "gpu-system" // not the default: the templates must follow
	claimNS    = "team-a"
	nodeA      = "node-a"
	nodeB      = "node-b"
	shareID    = "0a1b2c3d-0000-4000-8000-000000000001"
	nodeKey    = "authentication.kubernetes.io/node-name"
	migDevice  = "gpu-1-mig-1g10gb-19-0"
	wholeGPU   = "gpu-0"
	sharedGPU  = "gpu-2"
	nicDevice  = "nic-0"
	pollPeriod = 50 * time.Millisecond
)

func TestMain(m *testing.M) {
	klog.InitFlags(nil)
	flag.Parse()
	if !testing.Verbose() {
		// kube-apiserver logs a lot at level 0; keep a passing run quiet.
		_ = flag.Set("logtostderr", "false")
		_ = flag.Set("alsologtostderr", "false")
		_ = flag.Set("stderrthreshold", "FATAL")
		klog.SetOutput(io.Discard)
	}
	os.Exit(m.Run())
}

// pluginDevices are what the plugin prepared on node A.
var pluginDevices = []devicestatus.Device{
	{Pool: nodeA, Name: wholeGPU, UUID: "GPU-00000000-0000-0000-0000-000000000000"},
	{Pool: nodeA, Name: migDevice, UUID: "MIG-11111111-1111-1111-1111-111111111111", ParentUUID: "GPU-11111111-1111-1111-1111-111111111111"},
	{Pool: nodeA, Name: sharedGPU, ShareID: shareID, UUID: "GPU-22222222-2222-2222-2222-222222222222"},
}

// TestKubeletPluginDeviceStatus walks one claim through the cases, in
// order: no binding, binding, the wrong node, no node, another driver, a
// repeated record, a recreated claim, removal, a deleted claim.
// startControlPlane starts a control plane that authorizes with Node and
// RBAC, and returns it with an admin client and the function that stops
// it (to defer).
func startControlPlane(t *testing.T, ctx context.Context) (*controlplane.ControlPlane, kubernetes.Interface, func()) {
	t.Helper()
	start := time.Now()
	cp, err := controlplane.Start(ctx, controlplane.Options{AuthorizationModes: []string{"Node", "RBAC"}})
	if err != nil {
		t.Fatal(err)
	}
	stop := func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	}
	t.Logf("control plane with Node,RBAC ready in %v", time.Since(start))
	return cp, kubernetes.NewForConfigOrDie(cp.RESTConfig("rbactest-admin", 100, 200)), stop
}

func TestKubeletPluginDeviceStatus(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cp, admin, stop := startControlPlane(t, ctx)
	defer stop()

	objs, err := rbac.KubeletPlugin(pluginNS, driver)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{pluginNS, claimNS} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.CoreV1().ServiceAccounts(pluginNS).Create(ctx, objs.ServiceAccount, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, objs.ClusterRole, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	claim := allocateClaim(ctx, t, admin)

	// plugin is the kubelet plugin's client on a node, as a bound token
	// of one of its pods authenticates: the ServiceAccount, its groups,
	// and the node the pod runs on (none when node is empty).
	plugin := func(node string) kubernetes.Interface {
		cfg := cp.RESTConfig("gpudra-kubelet-plugin", 100, 200)
		cfg.Impersonate = rest.ImpersonationConfig{
			UserName: "system:serviceaccount:" + pluginNS + ":" + objs.ServiceAccount.Name,
			Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + pluginNS, "system:authenticated"},
		}
		if node != "" {
			cfg.Impersonate.Extra = map[string][]string{nodeKey: {node}}
		}
		return kubernetes.NewForConfigOrDie(cfg)
	}
	writer := func(driverName, node string) *devicestatus.Writer {
		w, err := devicestatus.NewWriter(plugin(node), driverName, node)
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	onA := writer(driver, nodeA)
	ref := kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: claim.Namespace, Name: claim.Name}, UID: claim.UID}
	get := func() *resourceapi.ResourceClaim {
		t.Helper()
		c, err := admin.ResourceV1().ResourceClaims(claimNS).Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	// unchanged fails the test if the claim changed since before.
	unchanged := func(before *resourceapi.ResourceClaim) {
		t.Helper()
		if after := get(); after.ResourceVersion != before.ResourceVersion {
			t.Errorf("claim changed: resourceVersion %s -> %s, devices %+v", before.ResourceVersion, after.ResourceVersion, after.Status.Devices)
		}
	}

	t.Run("no binding", func(t *testing.T) {
		before := get()
		err := onA.Record(ctx, before, pluginDevices)
		if !apierrors.IsForbidden(err) {
			t.Fatalf("without the ClusterRoleBinding: got %v, want Forbidden", err)
		}
		t.Logf("refused as it should be: %v", err)
		unchanged(before)
	})

	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, objs.ClusterRoleBinding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	t.Run("own node", func(t *testing.T) {
		// The RBAC authorizer sees the new binding through an informer.
		var lastErr error
		err := clustertest.Poll(ctx, 30*time.Second, func() bool {
			lastErr = onA.Record(ctx, get(), pluginDevices)
			return lastErr == nil
		})
		if err != nil {
			t.Fatalf("record on node A with the binding: %v (last error: %v)", err, lastErr)
		}
		checkRecorded(t, get())
	})

	noNode, err := devicestatus.NewWriter(plugin(""), driver, nodeA)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		w    *devicestatus.Writer
		// devices are what it tries to record.
		devices []devicestatus.Device
	}{
		// Another node's plugin: the claim is allocated on node A.
		{"other node", writer(driver, nodeB), []devicestatus.Device{{Pool: nodeA, Name: wholeGPU, UUID: "GPU-forged"}}},
		// A token not bound to a pod on a node.
		{"no node", noNode, []devicestatus.Device{{Pool: nodeA, Name: wholeGPU, UUID: "GPU-forged"}}},
		// Our ServiceAccount writing another driver's entry.
		{"other driver", writer(otherDrv, nodeA), []devicestatus.Device{{Pool: nodeA, Name: nicDevice, UUID: "forged"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := get()
			err := tc.w.Record(ctx, before, tc.devices)
			// The status patch itself is allowed; the API server's
			// per-driver check refuses the status.devices change.
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), `changing status.devices requires resource="resourceclaims/driver"`) {
				t.Fatalf("got %v, want Invalid: changing status.devices requires resource=\"resourceclaims/driver\"", err)
			}
			t.Logf("refused as it should be: %v", err)
			unchanged(before)
		})
	}

	t.Run("record again", func(t *testing.T) {
		// The claim as read carries the Ready conditions; recording the
		// same devices again must not write.
		before := get()
		if err := onA.Record(ctx, before, pluginDevices); err != nil {
			t.Fatal(err)
		}
		unchanged(before)
	})

	t.Run("recreated claim", func(t *testing.T) {
		before := get()
		stale := before.DeepCopy()
		stale.UID = "00000000-0000-0000-0000-00000000dead"
		if err := onA.Record(ctx, stale, pluginDevices[:1]); err == nil {
			t.Error("record with another claim's UID succeeded")
		} else {
			t.Logf("refused as it should be: %v", err)
		}
		staleRef := ref
		staleRef.UID = stale.UID
		if err := onA.Remove(ctx, staleRef); err != nil {
			t.Errorf("remove with another claim's UID: %v, want success (that claim is gone)", err)
		}
		unchanged(before)
	})

	t.Run("remove", func(t *testing.T) {
		if err := onA.Remove(ctx, ref); err != nil {
			t.Fatal(err)
		}
		after := get()
		var left []string
		for _, d := range after.Status.Devices {
			left = append(left, d.Driver+"/"+d.Device)
		}
		if !slices.Equal(left, []string{otherDrv + "/" + nicDevice}) {
			t.Errorf("entries left %v, want only the other driver's", left)
		}
		for _, mf := range after.ManagedFields {
			if mf.Manager == onA.FieldManager() {
				t.Errorf("field manager %s still owns fields: %s", mf.Manager, mf.FieldsV1.GetRawString())
			}
		}
		// Again: nothing to remove is a no-op.
		if err := onA.Remove(ctx, ref); err != nil {
			t.Fatal(err)
		}
		unchanged(after)
	})

	t.Run("deleted claim", func(t *testing.T) {
		if err := admin.ResourceV1().ResourceClaims(claimNS).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := onA.Remove(ctx, ref); err != nil {
			t.Errorf("remove from a deleted claim: %v, want success", err)
		}
	})
}

// allocateClaim creates a claim in claimNS and, as the scheduler would,
// allocates it on node A: three devices of ours (a whole GPU, a MIG device,
// a share) and one of another driver, whose status entry it also writes.
func allocateClaim(ctx context.Context, t *testing.T, admin kubernetes.Interface) *resourceapi.ResourceClaim {
	t.Helper()
	request := func(name, class string) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class}}
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: claimNS, Name: "training"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			request("gpu", "gpu.nvidia.com"), request("mig", "mig.nvidia.com"), request("share", "gpu.nvidia.com"), request("nic", "nic.example.com"),
		}}},
	}
	claim, err := admin.ResourceV1().ResourceClaims(claimNS).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: "gpu", Driver: driver, Pool: nodeA, Device: wholeGPU},
			{Request: "mig", Driver: driver, Pool: nodeA, Device: migDevice},
			{Request: "share", Driver: driver, Pool: nodeA, Device: sharedGPU, ShareID: ptr.To(types.UID(shareID))},
			{Request: "nic", Driver: otherDrv, Pool: nodeA, Device: nicDevice},
		}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{nodeA}}},
		}}},
	}
	claim, err = admin.ResourceV1().ResourceClaims(claimNS).UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("allocate: %v", err)
	}
	claim.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: otherDrv, Pool: nodeA, Device: nicDevice}}
	claim, err = admin.ResourceV1().ResourceClaims(claimNS).UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("other driver's status: %v", err)
	}
	return claim
}

// checkRecorded checks the claim's status.devices: the other driver's
// entry untouched, ours with UUIDs and Ready, and the allocation intact.
func checkRecorded(t *testing.T, claim *resourceapi.ResourceClaim) {
	t.Helper()
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 4 {
		t.Errorf("allocation changed: %+v", claim.Status.Allocation)
	}
	want := map[string]devicestatus.Device{}
	for _, d := range pluginDevices {
		want[d.Name] = d
	}
	seenOther := false
	for _, got := range claim.Status.Devices {
		if got.Driver == otherDrv {
			seenOther = true
			if got.Device != nicDevice || got.Data != nil || len(got.Conditions) != 0 {
				t.Errorf("other driver's entry changed: %+v", got)
			}
			continue
		}
		d, ok := want[got.Device]
		if got.Driver != driver || got.Pool != nodeA || !ok {
			t.Errorf("unexpected entry %s/%s/%s", got.Driver, got.Pool, got.Device)
			continue
		}
		delete(want, got.Device)
		if ptr.Deref(got.ShareID, "") != d.ShareID {
			t.Errorf("%s: shareID %q, want %q", got.Device, ptr.Deref(got.ShareID, ""), d.ShareID)
		}
		data, err := devicestatus.DecodeData(got.Data)
		if err != nil || data.UUID != d.UUID || data.ParentUUID != d.ParentUUID {
			t.Errorf("%s: data %+v (%v), want uuid %q parentUUID %q", got.Device, data, err, d.UUID, d.ParentUUID)
		}
		if len(got.Conditions) != 1 || got.Conditions[0].Type != devicestatus.ConditionReady || got.Conditions[0].Status != metav1.ConditionTrue {
			t.Errorf("%s: conditions %+v, want Ready=True", got.Device, got.Conditions)
		}
	}
	if !seenOther {
		t.Error("the other driver's entry is gone")
	}
	if len(want) != 0 {
		t.Errorf("no entries for %v", want)
	}
	managers := map[string]bool{}
	for _, mf := range claim.ManagedFields {
		if mf.Subresource == "status" && mf.Operation == metav1.ManagedFieldsOperationApply {
			managers[mf.Manager] = true
		}
	}
	if want := devicestatus.FieldManager(driver, nodeA); !managers[want] {
		t.Errorf("no status apply by %s in managedFields (appliers: %v)", want, managers)
	}
}
