package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/mps/mpsfake"

	"github.com/gpudra/gpudra/localcluster/cluster"
)

// fractionalFleet has one H100 node per sharing mode.
const fractionalFleet = `nodes:
- name: share-mem
  sharing: memory-compute
  gpus: [{model: H100-SXM5-80GB}]
- name: share-4
  sharing: shares=4
  gpus: [{model: H100-SXM5-80GB}]
- name: share-any
  sharing: unlimited
  gpus: [{model: H100-SXM5-80GB}]
`

// sharedPods is podWithTemplate for a full GPU with the given request body
// (and optional config), its pods pinned to node.
func sharedPods(ns, node, request, config string, pods ...string) string {
	return podWithTemplate(ns, "        exactly:\n          deviceClassName: gpu.nvidia.com\n"+request+config,
		"  nodeSelector: {kubernetes.io/hostname: "+node+"}", pods...)
}

// TestFractionalGPUs runs a cluster of its own, one node per sharing mode,
// and checks with the real scheduler that shares of one GPU fill it and
// no more, that each capped share gets its MPS daemon with its caps, and
// that two claims sharing a GPU cannot set two time-slice intervals.
func TestFractionalGPUs(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	fleet, err := sim.Parse([]byte(fractionalFleet), "fractional")
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.Start(ctx, cluster.Options{Fleet: fleet, MPSControlBinary: mpsControl})
	if err != nil {
		t.Fatal(err)
	}
	// The helpers act on demo; point them at this cluster meanwhile.
	saved := demo
	demo = c
	t.Cleanup(func() {
		demo = saved
		if err := c.Stop(); err != nil {
			t.Errorf("stop the sharing cluster: %v", err)
		}
	})

	t.Run("memory quarters", func(t *testing.T) {
		mem := publishedMemory(t, ctx, "share-mem")
		quarter := resource.NewQuantity(mem/4, resource.BinarySI)
		request := fmt.Sprintf("          capacity: {requests: {memory: %q}}\n", quarter.String())
		apply(t, ctx, sharedPods("share-mem", "share-mem", request, "", "p0", "p1", "p2", "p3"))
		checkShares(t, ctx, "share-mem", []string{"p0", "p1", "p2", "p3"}, 0, mem/4)
		apply(t, ctx, sharedPods("share-mem-more", "share-mem", request, "", "p4"))
		waitPending(t, ctx, "share-mem-more", "p4")
	})

	t.Run("NVIDIA integer shares", func(t *testing.T) {
		// As NVIDIA's integer-sharing manifests ask for a share: the
		// class alone, no capacity, which takes the default of one share.
		apply(t, ctx, sharedPods("share-4", "share-4", "", "", "p0", "p1", "p2", "p3"))
		mem := publishedMemory(t, ctx, "share-4")
		checkShares(t, ctx, "share-4", []string{"p0", "p1", "p2", "p3"}, 25, mem/4)
		// Explicitly, in shares.
		apply(t, ctx, sharedPods("share-4-more", "share-4", "          capacity: {requests: {shares: \"1\"}}\n", "", "p4"))
		waitPending(t, ctx, "share-4-more", "p4")
	})

	t.Run("conflicting time slices", func(t *testing.T) {
		ts := func(interval string) string {
			return fmt.Sprintf(`      config:
      - opaque:
          driver: gpu.nvidia.com
          parameters:
            apiVersion: resource.nvidia.com/v1beta1
            kind: GpuConfig
            sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: %s}}
`, interval)
		}
		apply(t, ctx, sharedPods("ts-long", "share-any", "", ts("Long"), "pod"))
		long := waitForPod(t, ctx, "ts-long", "pod", "Running", running)
		gpu := attr(devicesOf(t, ctx, long)[0], "uuid")
		if got, _ := c.Node("share-any").TimeSlice(gpu); got != "Long" {
			t.Errorf("GPU time slice %q, want Long", got)
		}
		apply(t, ctx, sharedPods("ts-short", "share-any", "", ts("Short"), "pod"))
		short := waitForPod(t, ctx, "ts-short", "pod", "refused", func(p *corev1.Pod) bool { return reasonOf(p) != "" })
		if short.Status.Phase != corev1.PodPending || short.Spec.NodeName != "share-any" || !strings.Contains(reasonOf(short), "sharing.timeSlicingConfig.interval") {
			t.Errorf("second interval on the GPU: %s on %q, reason %q; want Pending on share-any naming sharing.timeSlicingConfig.interval", short.Status.Phase, short.Spec.NodeName, reasonOf(short))
		}
	})
}

// publishedMemory is the memory capacity of the node's one GPU.
func publishedMemory(t *testing.T, ctx context.Context, node string) int64 {
	t.Helper()
	for _, s := range nodeSlices(t, ctx, node) {
		for _, d := range s.Devices {
			if d.Name == "gpu-0" {
				q := d.Capacity["memory"].Value
				return q.Value()
			}
		}
	}
	t.Fatalf("%s publishes no gpu-0", node)
	return 0
}

// checkShares waits for the pods to run and checks that all got shares of
// the node's one GPU, each with its own MPS daemon capped at threads
// percent (0: uncapped) and pinned bytes (rounded down to MiB).
func checkShares(t *testing.T, ctx context.Context, ns string, pods []string, threads float64, pinned int64) {
	t.Helper()
	shareIDs := map[string]bool{}
	for _, name := range pods {
		pod := waitForPod(t, ctx, ns, name, "Running", running)
		devs := devicesOf(t, ctx, pod)
		if len(devs) != 1 || devs[0].Name != "gpu-0" {
			t.Fatalf("%s got %v, want a share of gpu-0", name, devs)
		}
		claim := allocatedClaim(t, ctx, pod)
		r := claim.Status.Allocation.Devices.Results[0]
		if r.ShareID == nil || shareIDs[string(*r.ShareID)] {
			t.Errorf("%s: share ID %v missing or given twice", name, r.ShareID)
		} else {
			shareIDs[string(*r.ShareID)] = true
		}
		rec, err := mpsfake.ReadRecord(demo.Node(pod.Spec.NodeName).MPSDirs(string(claim.UID)).Log)
		if err != nil {
			t.Errorf("%s: no MPS daemon for its share: %v", name, err)
			continue
		}
		gpu := attr(devs[0], "uuid")
		if got := rec.PinnedMemLimitMiB[gpu]; got != pinned>>20 {
			t.Errorf("%s: pinned memory cap %d MiB, want %d", name, got, pinned>>20)
		}
		if threads > 0 && (rec.ActiveThreadPercentage == nil || *rec.ActiveThreadPercentage != threads) {
			t.Errorf("%s: thread cap %v, want %v", name, rec.ActiveThreadPercentage, threads)
		}
		checkContainersSeeDevices(t, pod, devs)
	}
}

func waitPending(t *testing.T, ctx context.Context, ns, name string) {
	t.Helper()
	pod := waitForPod(t, ctx, ns, name, "unschedulable", func(p *corev1.Pod) bool { return reasonOf(p) != "" })
	if pod.Spec.NodeName != "" || !strings.Contains(reasonOf(pod), "cannot allocate all claims") {
		t.Errorf("pod %s/%s on %q with reason %q, want Pending for want of capacity", ns, name, pod.Spec.NodeName, reasonOf(pod))
	}
}

// allocatedClaim returns the pod's one claim.
func allocatedClaim(t *testing.T, ctx context.Context, pod *corev1.Pod) *resourceapi.ResourceClaim {
	t.Helper()
	names := cluster.ClaimNames(pod)
	if len(names) != 1 {
		t.Fatalf("pod %s has claims %v, want one", pod.Name, names)
	}
	claim, err := demo.Client().ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, names[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return claim
}
