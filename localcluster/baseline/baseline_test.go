package baseline_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpudra/gpudra/localcluster/baseline"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

const (
	driverName = "baseline.example.com"
	nodeName   = "node-000"
)

// TestPublishPrepareUnprepare: the baseline publishes the devices and
// counter sets of gpudra's device model under its own driver name, and a
// claim's devices resolve through the CDI library into their environment
// variable, until Unprepare removes the spec.
func TestPublishPrepareUnprepare(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fleet, err := simfleet.Parse([]byte("nodes:\n- name: "+nodeName+"\n  gpus:\n  - {model: H100-SXM5-80GB, migEnabled: true}\n  - {model: H100-SXM5-80GB}\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	node, err := fleet.Node(nodeName)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := node.Hardware().Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	model, err := devicemodel.Build(inv, devicemodel.WithDynamicMIG())
	if err != nil {
		t.Fatal(err)
	}
	dir := clustertest.ShortTempDir(t)
	client := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "node-uid"}})
	// Like the API server, name the slices created with generateName.
	var n atomic.Int64
	client.PrependReactor("create", "resourceslices", func(action k8stesting.Action) (bool, runtime.Object, error) {
		if obj, ok := action.(k8stesting.CreateAction).GetObject().(metav1.Object); ok && obj.GetName() == "" {
			obj.SetName(fmt.Sprintf("%s%05d", obj.GetGenerateName(), n.Add(1)))
		}
		return false, nil, nil
	})
	cfg := baseline.Config{
		DriverName: driverName, NodeName: nodeName, KubeClient: client,
		PluginDataDir: filepath.Join(dir, "plugin"), RegistrarDir: filepath.Join(dir, "registry"), CDIDir: filepath.Join(dir, "cdi"),
		Resources: model.DriverResources(nodeName),
	}
	for _, d := range []string{cfg.PluginDataDir, cfg.RegistrarDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d, err := baseline.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()

	// Published: every device and counter set of the model, ours.
	var devices, sets []string
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		devices, sets = nil, nil
		for _, s := range list.Items {
			if s.Spec.Driver != driverName || s.Spec.Pool.Name != nodeName {
				t.Fatalf("slice %s: driver %q pool %q", s.Name, s.Spec.Driver, s.Spec.Pool.Name)
			}
			for _, dev := range s.Spec.Devices {
				devices = append(devices, dev.Name)
			}
			for _, cs := range s.Spec.SharedCounters {
				sets = append(sets, cs.Name)
			}
		}
		return len(devices) == len(model.Devices), nil
	})
	if err != nil {
		t.Fatalf("published devices %v, want the model's %d: %v", devices, len(model.Devices), err)
	}
	if len(sets) != len(model.CounterSets) || len(sets) == 0 {
		t.Errorf("published counter sets %v, want the model's %d", sets, len(model.CounterSets))
	}

	full := devicemodel.GPUName(1)
	if !slices.Contains(devices, full) {
		t.Fatalf("no device %s among %v", full, devices)
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "one-gpu", UID: "0f1e2d3c-0000-0000-0000-000000000001"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{
				{Request: "gpu", Driver: driverName, Pool: nodeName, Device: full},
				{Request: "other", Driver: "gpu.nvidia.com", Pool: nodeName, Device: "gpu-0"},
			},
		}}},
	}
	res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim})
	if err != nil || res[claim.UID].Err != nil {
		t.Fatalf("Prepare: %v %v", err, res[claim.UID].Err)
	}
	got := res[claim.UID].Devices
	if len(got) != 1 || got[0].DeviceName != full || len(got[0].CDIDeviceIDs) != 1 {
		t.Fatalf("Prepare gave %+v, want %s alone with one CDI device", got, full)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(cfg.CDIDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	dev := cache.GetDevice(got[0].CDIDeviceIDs[0])
	if dev == nil {
		t.Fatalf("CDI device %s does not resolve: %v", got[0].CDIDeviceIDs[0], cache.GetErrors())
	}
	if env := dev.ContainerEdits.Env; !slices.Equal(env, []string{baseline.DeviceEnv + "=" + full}) {
		t.Errorf("CDI device edits env %v, want only %s=%s", env, baseline.DeviceEnv, full)
	}

	un, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: claim.UID}})
	if err != nil || un[claim.UID] != nil {
		t.Fatalf("Unprepare: %v %v", err, un[claim.UID])
	}
	if err := cache.Refresh(); err != nil {
		t.Fatal(err)
	}
	if cache.GetDevice(got[0].CDIDeviceIDs[0]) != nil {
		t.Error("the claim's CDI device still resolves after Unprepare")
	}

	// A claim that is not allocated gets an error of its own.
	res, err = d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{{ObjectMeta: metav1.ObjectMeta{Name: "pending", UID: "u2"}}})
	if err != nil || res["u2"].Err == nil {
		t.Errorf("Prepare of an unallocated claim: %v %+v, want an error for the claim", err, res["u2"])
	}
}
