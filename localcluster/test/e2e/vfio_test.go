package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// freeVFIOGPU returns a node and the UUID and PCI bus ID of a GPU there
// that is offered for passthrough and that no claim holds in any form.
func freeVFIOGPU(t *testing.T, ctx context.Context) (node, uuid, busID string) {
	t.Helper()
	claims, err := demo.Client().ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	taken := map[string]bool{} // pool/device
	for _, c := range claims.Items {
		if c.Status.Allocation != nil {
			for _, r := range c.Status.Allocation.Devices.Results {
				taken[r.Pool+"/"+r.Device] = true
			}
		}
	}
	for _, n := range []string{"dgx-h100-0", "dgx-h100-1", "dgx-a100-0"} {
		busy := map[string]bool{} // GPU UUIDs held
		var candidates [][2]string
		for _, s := range nodeSlices(t, ctx, n) {
			for _, d := range s.Devices {
				gpu := attr(d, "uuid")
				if p := attr(d, "parentUUID"); p != "" {
					gpu = p
				}
				if taken[n+"/"+d.Name] {
					busy[gpu] = true
				}
				if attr(d, "type") == "vfio" {
					candidates = append(candidates, [2]string{gpu, attr(d, "resource.kubernetes.io/pciBusID")})
				}
			}
		}
		for _, c := range candidates {
			if !busy[c[0]] {
				return n, c[0], c[1]
			}
		}
	}
	t.Fatal("no free GPU offered for passthrough")
	return "", "", ""
}

// TestVFIOPassthrough: a VFIO claim gets the GPU's IOMMU group bound to
// vfio-pci and the VFIO device nodes in its CDI edits; while it holds the
// GPU, a full-GPU claim that only that GPU satisfies stays Pending (the
// shared counters keep the scheduler from it); once the VFIO pod is gone,
// the GPU is bound back to nvidia and goes to the waiting pod.
func TestVFIOPassthrough(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	node, gpu, busID := freeVFIOGPU(t, ctx)
	fake := demo.SimNode(node).Sysfs()
	pod := func(ns, class string) {
		t.Helper()
		create(t, ctx, demo, clustertest.Namespace(ns),
			clustertest.Claim(ns, "gpu", clustertest.Spec(clustertest.Request("gpu", class, "device.attributes['gpu.nvidia.com'].uuid == '"+gpu+"'"))),
			clustertest.Pod(ns, "pod", clustertest.PodClaim{Claim: "gpu"}))
	}
	pod("vfio-vm", "vfio.gpu.nvidia.com")
	vm := waitForPod(t, ctx, "vfio-vm", "pod", "Running", running)
	devs := devicesOf(t, ctx, vm)
	if len(devs) != 1 || attr(devs[0], "type") != "vfio" || vm.Spec.NodeName != node {
		t.Fatalf("VFIO pod got %v on %s, want one vfio device on %s", devs, vm.Spec.NodeName, node)
	}
	if b, _ := fake.Binding(busID); b.Driver != "vfio-pci" {
		t.Errorf("GPU %s bound to %q while passed through, want vfio-pci", busID, b.Driver)
	}
	ctrs, _ := demo.SimNode(node).Containers(vm)
	nodes := ctrs["ctr"].DeviceNodes
	if !slices.Contains(nodes, "/dev/vfio/vfio") || !slices.ContainsFunc(nodes, func(p string) bool { return strings.HasPrefix(p, "/dev/vfio/") && p != "/dev/vfio/vfio" }) {
		t.Errorf("VFIO container's device nodes %v, want /dev/vfio/<group> and /dev/vfio/vfio", nodes)
	}
	if slices.ContainsFunc(nodes, func(p string) bool { return strings.HasPrefix(p, "/dev/nvidia") }) {
		t.Errorf("VFIO container got NVIDIA driver nodes %v", nodes)
	}

	pod("vfio-cuda", "gpu.nvidia.com")
	cuda := waitForPod(t, ctx, "vfio-cuda", "pod", "unschedulable", func(p *corev1.Pod) bool { return reasonOf(p) != "" })
	if cuda.Spec.NodeName != "" || !strings.Contains(reasonOf(cuda), "cannot allocate all claims") {
		t.Fatalf("full-GPU pod on %q with reason %q while the GPU is passed through, want Pending", cuda.Spec.NodeName, reasonOf(cuda))
	}

	if err := demo.Client().CoreV1().Pods("vfio-vm").Delete(ctx, "pod", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	cuda = waitForPod(t, ctx, "vfio-cuda", "pod", "Running", running)
	if b, _ := fake.Binding(busID); b.Driver != "nvidia" || b.Override != "" {
		t.Errorf("GPU %s after the VFIO pod went: %+v, want nvidia and no override", busID, b)
	}
	if devs := devicesOf(t, ctx, cuda); len(devs) != 1 || attr(devs[0], "uuid") != gpu || attr(devs[0], "type") != "gpu" {
		t.Errorf("full-GPU pod got %v, want the GPU %s", devs, gpu)
	}
	checkContainersSeeDevices(t, cuda, devicesOf(t, ctx, cuda))
	if err := demo.Client().CoreV1().Pods("vfio-cuda").Delete(ctx, "pod", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}
