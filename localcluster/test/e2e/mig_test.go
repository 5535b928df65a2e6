package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpudra/gpudra/localcluster/test/clustertest"
	"github.com/gpudra/gpudra/pkg/devicestatus"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// migNode runs dynamic MIG in the demo fleet; its GPUs 4-7 are in MIG mode.
const migNode = "dgx-h100-1"

// emptyMIGGPU returns the UUID of one of migNode's MIG-mode GPUs (minors
// 4-7) that holds no MIG device: the examples may have used another.
func emptyMIGGPU(t *testing.T, ctx context.Context) string {
	t.Helper()
	specs := nodeSlices(t, ctx, migNode)
	for minor := 4; minor < 8; minor++ {
		want := fmt.Sprintf("gpu-%d-mig-7g80gb-0-0", minor)
		for _, s := range specs {
			for _, d := range s.Devices {
				if uuid := attr(d, "parentUUID"); d.Name == want && len(instancesOn(t, ctx, uuid)) == 0 {
					return uuid
				}
			}
		}
	}
	t.Fatalf("%s has no MIG-mode GPU without MIG devices", migNode)
	return ""
}

// migPods is a namespace with one claim template per profile, each asking
// for that profile on the given GPU, and pods named <x>-<profile's g>
// using them ("a-3g" uses 3g.40gb).
func migPods(ns, gpuUUID string, pods ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n", ns)
	for _, profile := range []string{"1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"} {
		fmt.Fprintf(&b, `---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {namespace: %s, name: %s}
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '%s' && device.attributes['gpu.nvidia.com'].parentUUID == '%s'"}
`, ns, strings.Split(profile, ".")[0], profile, gpuUUID)
	}
	for _, p := range pods {
		b.WriteString(migPod(ns, p))
	}
	return b.String()
}

// migPod is a pod named <x>-<template> with a claim from that template of
// migPods.
func migPod(ns, name string) string {
	tmpl := name[strings.Index(name, "-")+1:]
	return fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata: {namespace: %s, name: %s}
spec:
  containers:
  - name: ctr
    image: ubuntu:24.04
    resources:
      claims: [{name: mig}]
  resourceClaims:
  - name: mig
    resourceClaimTemplateName: %s
`, ns, name, tmpl)
}

// memorySlices are the memory slices a MIG device occupies, from its
// published capacity.
func memorySlices(d resourceapi.Device) []int {
	var out []int
	for i := 0; i < 8; i++ {
		if _, ok := d.Capacity[resourceapi.QualifiedName(fmt.Sprintf("memorySlice%d", i))]; ok {
			out = append(out, i)
		}
	}
	return out
}

// instancesOn lists the MIG devices that exist on a GPU of migNode.
func instancesOn(t *testing.T, ctx context.Context, gpuUUID string) []hardware.MIGDevice {
	t.Helper()
	inv, err := demo.SimNode(migNode).Hardware().Discover(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range inv.GPUs {
		if g.UUID == gpuUUID {
			return g.MIGDevices
		}
	}
	t.Fatalf("no GPU %s on %s", gpuUUID, migNode)
	return nil
}

func deletePods(t *testing.T, ctx context.Context, ns string, names ...string) {
	t.Helper()
	for _, name := range names {
		if err := demo.Client().CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDynamicMIGFillsAGPU: pods asking for 3g, 2g, 1g and 1g MIG devices of
// one simulated H100 are placed without overlap until the GPU is full;
// the next waits with the scheduler's reason; deleting a pod destroys its
// MIG device and frees its slices for the waiting one; a 7g pod fits only
// once the GPU is empty. Each claim's status.devices, written by the
// plugin under its own ServiceAccount's permissions, names the MIG device.
func TestDynamicMIGFillsAGPU(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	const ns = "mig-fill"
	gpu := emptyMIGGPU(t, ctx)
	full := []string{"a-3g", "b-2g", "c-1g", "d-1g"}
	apply(t, ctx, migPods(ns, gpu))
	used := map[int]string{}
	for _, name := range full {
		// One after the other, largest first: the scheduler takes the
		// first free placement for each pod, it does not pack a batch, so
		// two 1g pods scheduled before the 3g could leave no 3g+2g room.
		apply(t, ctx, migPod(ns, name))
		pod := waitForPod(t, ctx, ns, name, "Running", running)
		devs := devicesOf(t, ctx, pod)
		if len(devs) != 1 || pod.Spec.NodeName != migNode || attr(devs[0], "parentUUID") != gpu {
			t.Fatalf("%s got %v on %s, want one MIG device of %s", name, devs, pod.Spec.NodeName, gpu)
		}
		for _, s := range memorySlices(devs[0]) {
			if other, taken := used[s]; taken {
				t.Errorf("memory slice %d given to %s and %s", s, other, name)
			}
			used[s] = name
		}
		checkContainersSeeDevices(t, pod, devs)
		checkDeviceStatus(t, ctx, pod, gpu)
	}
	if got := instancesOn(t, ctx, gpu); len(got) != len(full) {
		t.Errorf("%d MIG devices exist on the GPU, want %d: %+v", len(got), len(full), got)
	}

	// Full: 3+2+1+1 compute slices.
	apply(t, ctx, migPods(ns+"-more", gpu, "e-1g"))
	e := waitForPod(t, ctx, ns+"-more", "e-1g", "unschedulable", func(p *corev1.Pod) bool { return reasonOf(p) != "" })
	if e.Spec.NodeName != "" || !strings.Contains(reasonOf(e), "cannot allocate all claims") {
		t.Fatalf("fifth pod on %q with reason %q, want Pending for want of devices", e.Spec.NodeName, reasonOf(e))
	}

	deletePods(t, ctx, ns, "a-3g")
	e = waitForPod(t, ctx, ns+"-more", "e-1g", "Running", running)
	if devs := devicesOf(t, ctx, e); len(devs) != 1 || attr(devs[0], "parentUUID") != gpu {
		t.Errorf("fifth pod got %v, want a MIG device of %s", devs, gpu)
	}

	apply(t, ctx, migPods(ns+"-7g", gpu, "f-7g"))
	f := waitForPod(t, ctx, ns+"-7g", "f-7g", "unschedulable", func(p *corev1.Pod) bool { return reasonOf(p) != "" })
	if f.Spec.NodeName != "" {
		t.Fatalf("7g pod bound to %s while the GPU is partly used", f.Spec.NodeName)
	}
	deletePods(t, ctx, ns, "b-2g", "c-1g", "d-1g")
	deletePods(t, ctx, ns+"-more", "e-1g")
	f = waitForPod(t, ctx, ns+"-7g", "f-7g", "Running", running)
	got := instancesOn(t, ctx, gpu)
	if len(got) != 1 || got[0].Profile != "7g.80gb" {
		t.Errorf("MIG devices on the GPU = %+v, want only the 7g pod's", got)
	}
	checkDeviceStatus(t, ctx, f, gpu)
	deletePods(t, ctx, ns+"-7g", "f-7g")
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		return len(instancesOn(t, ctx, gpu)) == 0, nil
	})
	if err != nil {
		t.Errorf("MIG devices left on the GPU after every pod was deleted: %+v", instancesOn(t, ctx, gpu))
	}
}

// checkDeviceStatus checks that the pod's claim carries the MIG device's
// UUID and its parent's in status.devices, and that the UUID is that of a
// MIG device that exists.
func checkDeviceStatus(t *testing.T, ctx context.Context, pod *corev1.Pod, gpu string) {
	t.Helper()
	var claim *resourceapi.ResourceClaim
	err := clustertest.Poll(ctx, 0, func() bool {
		c, err := demo.Client().ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, cluster0ClaimName(pod), metav1.GetOptions{})
		if err != nil {
			return false
		}
		claim = c
		return len(c.Status.Devices) > 0
	})
	if err != nil {
		t.Errorf("%s: claim has no status.devices", pod.Name)
		return
	}
	st := claim.Status.Devices[0]
	data, err := devicestatus.DecodeData(st.Data)
	if err != nil {
		t.Fatal(err)
	}
	instances := instancesOn(t, ctx, gpu)
	i := slices.IndexFunc(instances, func(m hardware.MIGDevice) bool { return m.UUID == data.UUID })
	if st.Driver != "gpu.nvidia.com" || data.ParentUUID != gpu || !strings.HasPrefix(data.UUID, "MIG-") || i < 0 {
		t.Errorf("%s: status.devices[0] = %s/%s data %+v; want a MIG device of %s that exists", pod.Name, st.Driver, st.Device, data, gpu)
		return
	}
	checkInfoMetric(t, ctx, pod, gpu, data.UUID, strconv.Itoa(instances[i].GIID))
}

// TestDynamicMIGMatchAttributeParent: a claim with two MIG requests
// constrained to one parent GPU gets both from one GPU.
func TestDynamicMIGMatchAttributeParent(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	const ns = "mig-same-parent"
	apply(t, ctx, `apiVersion: v1
kind: Namespace
metadata: {name: mig-same-parent}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {namespace: mig-same-parent, name: pair}
spec:
  spec:
    devices:
      requests:
      - name: small
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '1g.10gb' && !('uuid' in device.attributes['gpu.nvidia.com'])"}
      - name: medium
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '3g.40gb' && !('uuid' in device.attributes['gpu.nvidia.com'])"}
      constraints:
      - matchAttribute: gpu.nvidia.com/parentUUID
---
apiVersion: v1
kind: Pod
metadata: {namespace: mig-same-parent, name: pod}
spec:
  containers:
  - name: ctr
    image: ubuntu:24.04
    resources:
      claims: [{name: pair}]
  resourceClaims:
  - name: pair
    resourceClaimTemplateName: pair
`)
	pod := waitForPod(t, ctx, ns, "pod", "Running", running)
	devs := devicesOf(t, ctx, pod)
	if len(devs) != 2 || attr(devs[0], "parentUUID") == "" || attr(devs[0], "parentUUID") != attr(devs[1], "parentUUID") {
		t.Fatalf("devices %v, want two MIG devices of one GPU", devs)
	}
	checkContainersSeeDevices(t, pod, devs)
	if got := instancesOn(t, ctx, attr(devs[0], "parentUUID")); len(got) < 2 {
		t.Errorf("MIG devices on the GPU = %+v, want the claim's two", got)
	}
	deletePods(t, ctx, ns, "pod")
}

// cluster0ClaimName is the name of the pod's (only) claim.
func cluster0ClaimName(pod *corev1.Pod) string {
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			return *s.ResourceClaimName
		}
	}
	return ""
}
