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

	"github.com/gpudra/gpudra/internal/mpsfake"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// fractionalFleet has one H100 node per sharing mode, one sharing as
// NVIDIA's driver does by default, one with two GPUs, and one unshared: a
// cluster that mixes modes.
const fractionalFleet = `nodes:
- name: share-mem
  sharing: memory-compute
  gpus: [{model: H100-SXM5-80GB}]
- name: share-4
  sharing: shares=4
  gpus: [{model: H100-SXM5-80GB}]
- name: share-4-nvidia
  sharing: shares=4
  sharingDefault: share
  gpus: [{model: H100-SXM5-80GB}]
- name: share-any
  sharing: unlimited
  gpus: [{model: H100-SXM5-80GB}]
- name: share-mem-2
  sharing: memory-compute
  gpus: [{model: H100-SXM5-80GB}, {model: H100-SXM5-80GB}]
- name: unshared
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
	c := startFleet(t, ctx, "fractional", fractionalFleet, cluster.Options{})
	useAsDemo(t, c)

	t.Run("a claim that asks for nothing gets the whole GPU on every node", func(t *testing.T) {
		// TimeSlicing, which a capped share refuses, works on each: the
		// claim is the whole GPU, uncapped, with no MPS daemon.
		ts := `      config:
      - opaque:
          driver: gpu.nvidia.com
          parameters:
            apiVersion: resource.nvidia.com/v1beta1
            kind: GpuConfig
            sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: Medium}}
`
		for _, node := range []string{"share-mem", "share-4", "share-any", "unshared"} {
			ns := "whole-" + node
			apply(t, ctx, sharedPods(ns, node, "", ts, "pod"))
			pod := waitForPod(t, ctx, ns, "pod", "Running", running)
			devs := devicesOf(t, ctx, pod)
			claim := allocatedClaim(t, ctx, pod)
			if _, err := mpsfake.ReadRecord(c.SimNode(node).MPSDirs(string(claim.UID)).Log); err == nil {
				t.Errorf("%s: a claim that asked for nothing got a capped share with an MPS daemon", node)
			}
			if got, _ := c.SimNode(node).TimeSlice(attr(devs[0], "uuid")); got != "Medium" {
				t.Errorf("%s: time slice %q, want Medium", node, got)
			}
			// The GPU is taken whole: a share of it does not fit.
			if node != "unshared" {
				share := map[string]string{"share-mem": "memory: 1Gi", "share-4": "shares: \"1\"", "share-any": "memory: 1Gi"}[node]
				apply(t, ctx, sharedPods(ns+"-share", node, "          capacity: {requests: {"+share+"}}\n", "", "pod"))
				waitPending(t, ctx, ns+"-share", "pod")
				deletePod(t, ctx, ns+"-share", "pod")
			}
			deletePod(t, ctx, ns, "pod")
		}
	})

	t.Run("a pod with two plain claims runs on a shared node", func(t *testing.T) {
		apply(t, ctx, `apiVersion: v1
kind: Namespace
metadata: {name: two-plain}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {namespace: two-plain, name: gpu}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.nvidia.com}
---
apiVersion: v1
kind: Pod
metadata: {namespace: two-plain, name: pod}
spec:
  nodeSelector: {kubernetes.io/hostname: share-mem-2}
  containers:
  - name: ctr
    image: ubuntu:24.04
    resources: {claims: [{name: a}, {name: b}]}
  resourceClaims:
  - {name: a, resourceClaimTemplateName: gpu}
  - {name: b, resourceClaimTemplateName: gpu}
`)
		pod := waitForPod(t, ctx, "two-plain", "pod", "Running", running)
		if devs := devicesOf(t, ctx, pod); len(devs) != 2 {
			t.Errorf("got %d devices, want the node's two GPUs", len(devs))
		}
	})

	t.Run("CEL chooses or avoids sharing", func(t *testing.T) {
		sel := func(expr string) string {
			return "          deviceClassName: gpu.nvidia.com\n          selectors:\n          - cel: {expression: '" + expr + "'}\n"
		}
		apply(t, ctx, podWithTemplate("cel-unshared", "        exactly:\n"+sel("!device.allowMultipleAllocations"), "", "pod"))
		if pod := waitForPod(t, ctx, "cel-unshared", "pod", "Running", running); pod.Spec.NodeName != "unshared" {
			t.Errorf("a claim for an unshared GPU ran on %s", pod.Spec.NodeName)
		}
		apply(t, ctx, podWithTemplate("cel-shares", "        exactly:\n"+sel(`device.attributes["gpu.nvidia.com"].sharingMode == "shares"`)+
			"          capacity: {requests: {shares: \"1\"}}\n", "", "pod"))
		if pod := waitForPod(t, ctx, "cel-shares", "pod", "Running", running); !strings.HasPrefix(pod.Spec.NodeName, "share-4") {
			t.Errorf("a claim for sharingMode shares ran on %s", pod.Spec.NodeName)
		}
		deletePod(t, ctx, "cel-unshared", "pod")
		deletePod(t, ctx, "cel-shares", "pod")
	})

	t.Run("memory quarters", func(t *testing.T) {
		mem := publishedMemory(t, ctx, "share-mem")
		quarter := resource.NewQuantity(mem/4, resource.BinarySI)
		request := fmt.Sprintf("          capacity: {requests: {memory: %q}}\n", quarter.String())
		applyOneByOne(t, ctx, "share-mem", "share-mem", request, "p0", "p1", "p2", "p3")
		checkShares(t, ctx, "share-mem", []string{"p0", "p1", "p2", "p3"}, 0, mem/4)
		apply(t, ctx, sharedPods("share-mem-more", "share-mem", request, "", "p4"))
		waitPending(t, ctx, "share-mem-more", "p4")
	})

	t.Run("integer shares", func(t *testing.T) {
		one := "          capacity: {requests: {shares: \"1\"}}\n"
		applyOneByOne(t, ctx, "share-4", "share-4", one, "p0", "p1", "p2", "p3")
		mem := publishedMemory(t, ctx, "share-4")
		checkShares(t, ctx, "share-4", []string{"p0", "p1", "p2", "p3"}, 25, mem/4)
		apply(t, ctx, sharedPods("share-4-more", "share-4", one, "", "p4"))
		waitPending(t, ctx, "share-4-more", "p4")
	})

	t.Run("NVIDIA integer shares with sharingDefault share", func(t *testing.T) {
		// As NVIDIA's integer-sharing manifests ask for a share: the
		// class alone, no capacity, which takes one share there.
		applyOneByOne(t, ctx, "share-4-nv", "share-4-nvidia", "", "p0", "p1", "p2", "p3")
		mem := publishedMemory(t, ctx, "share-4-nvidia")
		checkShares(t, ctx, "share-4-nv", []string{"p0", "p1", "p2", "p3"}, 25, mem/4)
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
		nothing := "          capacity: {requests: {memory: \"0\"}}\n"
		apply(t, ctx, sharedPods("ts-long", "share-any", nothing, ts("Long"), "pod"))
		long := waitForPod(t, ctx, "ts-long", "pod", "Running", running)
		gpu := attr(devicesOf(t, ctx, long)[0], "uuid")
		if got, _ := c.SimNode("share-any").TimeSlice(gpu); got != "Long" {
			t.Errorf("GPU time slice %q, want Long", got)
		}
		apply(t, ctx, sharedPods("ts-short", "share-any", nothing, ts("Short"), "pod"))
		short := waitForPod(t, ctx, "ts-short", "pod", "refused", func(p *corev1.Pod) bool { return reasonOf(p) != "" })
		if short.Status.Phase != corev1.PodPending || short.Spec.NodeName != "share-any" || !strings.Contains(reasonOf(short), "sharing.timeSlicingConfig.interval") {
			t.Errorf("second interval on the GPU: %s on %q, reason %q; want Pending on share-any naming sharing.timeSlicingConfig.interval", short.Status.Phase, short.Spec.NodeName, reasonOf(short))
		}
		// The refusal is an event on the pod and on its claim at once.
		waitForEvent(t, ctx, "ts-short", "Pod", "pod", "PrepareFailed", "sharing.timeSlicingConfig.interval")
		waitForEvent(t, ctx, "ts-short", "ResourceClaim", allocatedClaim(t, ctx, short).Name, "PrepareFailed", "sharing.timeSlicingConfig.interval")
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
		rec, err := mpsfake.ReadRecord(demo.SimNode(pod.Spec.NodeName).MPSDirs(string(claim.UID)).Log)
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

// waitForEvent waits for an event of reason on the object whose message
// contains text.
func waitForEvent(t *testing.T, ctx context.Context, ns, kind, name, reason, text string) {
	t.Helper()
	var seen []string
	err := clustertest.Poll(ctx, 30*time.Second, func() bool {
		list, err := demo.Client().CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		seen = seen[:0]
		for _, e := range list.Items {
			seen = append(seen, e.InvolvedObject.Kind+"/"+e.InvolvedObject.Name+": "+e.Reason)
			if e.InvolvedObject.Kind == kind && e.InvolvedObject.Name == name && e.Reason == reason && strings.Contains(e.Message, text) {
				return true
			}
		}
		return false
	})
	if err != nil {
		t.Errorf("no %s event on %s %s/%s naming %q; events: %v", reason, kind, ns, name, text, seen)
	}
}

// deletePod deletes a pod and waits until it is gone, so that its claim's
// devices are free again.
func deletePod(t *testing.T, ctx context.Context, ns, name string) {
	t.Helper()
	if err := demo.Client().CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := clustertest.Poll(ctx, time.Minute, func() bool {
		_, err := demo.Client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return err != nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s not gone: %v", ns, name, err)
	}
}

// applyOneByOne creates the pods of sharedPods one at a time, each once the
// one before runs. Four pods created at once to fill a GPU exactly
// sometimes left the fourth Pending for good with a share free: the
// scheduler (v1.37.1) rejected it while the others were in flight and
// nothing requeued it (seen about once in 30 runs before this test grew,
// and more often since). What is tested here is what the shares of a GPU
// add up to, which one at a time tests as well.
func applyOneByOne(t *testing.T, ctx context.Context, ns, node, request string, pods ...string) {
	t.Helper()
	for _, p := range pods {
		apply(t, ctx, sharedPods(ns, node, request, "", p))
		waitForPod(t, ctx, ns, p, "Running", running)
	}
}
