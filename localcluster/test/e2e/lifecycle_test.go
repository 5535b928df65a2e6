package e2e

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// podWithTemplate is a namespace, a claim template with the given
// request body, and pods using it.
func podWithTemplate(ns, request string, extraPodSpec string, pods ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: v1
kind: Namespace
metadata: {name: %s}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {namespace: %s, name: tmpl}
spec:
  spec:
    devices:
      requests:
      - name: dev
%s
`, ns, ns, request)
	for _, p := range pods {
		fmt.Fprintf(&b, `---
apiVersion: v1
kind: Pod
metadata: {namespace: %s, name: %s}
spec:
%s
  containers:
  - name: ctr
    image: ubuntu:24.04
    resources:
      claims: [{name: dev}]
  resourceClaims:
  - name: dev
    resourceClaimTemplateName: tmpl
`, ns, p, extraPodSpec)
	}
	return b.String()
}

// TestUnsatisfiableClaimStaysPending: a claim no device can satisfy leaves
// its pod Pending with the scheduler's reason.
func TestUnsatisfiableClaimStaysPending(t *testing.T) {
	ctx := testContext(t, time.Minute)
	apply(t, ctx, podWithTemplate("unsatisfiable", `        exactly:
          deviceClassName: gpu.nvidia.com
          selectors:
          - cel: {expression: "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA B200'"}`, "", "pod"))
	pod := waitForPod(t, ctx, "unsatisfiable", "pod", "unschedulable", func(p *corev1.Pod) bool { return reasonOf(p) != "" })
	if pod.Status.Phase != corev1.PodPending || pod.Spec.NodeName != "" {
		t.Fatalf("pod is %s on %q, want Pending and unbound", pod.Status.Phase, pod.Spec.NodeName)
	}
	// The scheduler's DynamicResources plugin says it cannot allocate.
	if r := reasonOf(pod); !strings.Contains(r, "cannot allocate all claims") {
		t.Errorf("reason %q does not come from the DynamicResources plugin", r)
	}
}

// TestPrepareErrorIsTheReason: a claim the scheduler can allocate but the
// plugin refuses to prepare leaves the pod Pending with the plugin's
// message, delivered through the kubelet's DRA manager. The config passes
// the webhook: a per-device limit for device index 3 is only wrong once
// the claim turns out to get one GPU.
func TestPrepareErrorIsTheReason(t *testing.T) {
	ctx := testContext(t, time.Minute)
	apply(t, ctx, `apiVersion: v1
kind: Namespace
metadata: {name: prepare-error}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {namespace: prepare-error, name: shared}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: gpu.nvidia.com}
    config:
    - opaque:
        driver: gpu.nvidia.com
        parameters:
          apiVersion: resource.nvidia.com/v1beta1
          kind: GpuConfig
          sharing: {strategy: MPS, mpsConfig: {defaultPerDevicePinnedMemoryLimit: {"3": 1Gi}}}
---
apiVersion: v1
kind: Pod
metadata: {namespace: prepare-error, name: pod}
spec:
  containers:
  - name: ctr
    image: ubuntu:24.04
    resources:
      claims: [{name: gpu}]
  resourceClaims:
  - name: gpu
    resourceClaimName: shared
`)
	pod := waitForPod(t, ctx, "prepare-error", "pod", "given a reason", func(p *corev1.Pod) bool { return reasonOf(p) != "" })
	if pod.Status.Phase != corev1.PodPending || pod.Spec.NodeName == "" {
		t.Fatalf("pod is %s on %q, want Pending on a node", pod.Status.Phase, pod.Spec.NodeName)
	}
	if r := reasonOf(pod); !strings.Contains(r, "sharing.mpsConfig.defaultPerDevicePinnedMemoryLimit[3]") || !strings.Contains(r, "allowed: 0 to 0") {
		t.Errorf("reason %q is not the plugin's refusal of the MPS setting", r)
	}
	// `kubectl logs` says the same.
	err := podLogsError(ctx, "prepare-error", "pod", &corev1.PodLogOptions{})
	if !strings.Contains(err.Error(), "waiting to start") || !strings.Contains(err.Error(), "defaultPerDevicePinnedMemoryLimit") {
		t.Errorf("logs of a pod whose claim the plugin refused: %v; want it waiting to start, with the plugin's message", err)
	}
	if err := demo.Client().CoreV1().Pods("prepare-error").Delete(ctx, "pod", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestDeleteReleasesDevice: the only existing 3g.40gb MIG device (static
// MIG on dgx-h100-0) goes to the first pod; the second waits. Deleting the first unprepares its claim (CDI
// spec and checkpoint entry gone) and the device goes to the second.
func TestDeleteReleasesDevice(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	const ns = "handover"
	request := `        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '3g.40gb' && 'uuid' in device.attributes['gpu.nvidia.com']"}`
	apply(t, ctx, podWithTemplate(ns, request, "", "first"))
	first := waitForPod(t, ctx, ns, "first", "Running", running)
	devs := devicesOf(t, ctx, first)
	if len(devs) != 1 || attr(devs[0], "profile") != "3g.40gb" {
		t.Fatalf("first pod got %v", devs)
	}
	node := first.Spec.NodeName
	uids := claimUIDs(t, ctx, first)
	if len(uids) != 1 {
		t.Fatalf("first pod has claims %v", uids)
	}
	claimUID := uids[0]
	if len(specFilesFor(t, node, claimUID)) == 0 || !checkpointHas(t, node, claimUID) {
		t.Fatalf("claim %s not prepared on %s: CDI specs %v, in checkpoint %v", claimUID, node,
			specFilesFor(t, node, claimUID), checkpointHas(t, node, claimUID))
	}

	apply(t, ctx, podWithTemplate(ns, request, "", "second"))
	second := waitForPod(t, ctx, ns, "second", "unschedulable", func(p *corev1.Pod) bool { return reasonOf(p) != "" })
	if second.Spec.NodeName != "" {
		t.Fatalf("second pod bound to %s while the only device is taken", second.Spec.NodeName)
	}

	if err := demo.Client().CoreV1().Pods(ns).Delete(ctx, "first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		return len(specFilesFor(t, node, claimUID)) == 0 && !checkpointHas(t, node, claimUID), nil
	})
	if err != nil {
		t.Fatalf("claim %s still prepared after its pod was deleted: CDI specs %v, in checkpoint %v", claimUID,
			specFilesFor(t, node, claimUID), checkpointHas(t, node, claimUID))
	}
	second = waitForPod(t, ctx, ns, "second", "Running", running)
	got := devicesOf(t, ctx, second)
	if len(got) != 1 || got[0].Name != devs[0].Name || second.Spec.NodeName != node {
		t.Errorf("second pod got %v on %s, want %s on %s", got, second.Spec.NodeName, devs[0].Name, node)
	}
	checkContainersSeeDevices(t, second, got)
}

// TestPluginRestart: restarting a node's plugin while pods run loses no
// prepared claim, publishes identical slices, and the claims prepared
// before the restart are unprepared by the new plugin.
func TestPluginRestart(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	const ns, nodeName = "restart", "dgx-h100-0"
	onNode := "  nodeSelector: {kubernetes.io/hostname: " + nodeName + "}"
	// The examples may have taken all of the node's whole GPUs; of its
	// eight 1g.10gb MIG devices they take at most one.
	request := `        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"}`
	apply(t, ctx, podWithTemplate(ns, request, onNode, "before0", "before1"))
	var prepared []string
	for _, name := range []string{"before0", "before1"} {
		pod := waitForPod(t, ctx, ns, name, "Running", running)
		prepared = append(prepared, claimUIDs(t, ctx, pod)...)
	}
	slicesBefore := nodeSlices(t, ctx, nodeName)
	specsBefore := map[string][]string{}
	for _, uid := range prepared {
		specsBefore[uid] = specFilesFor(t, nodeName, uid)
	}

	if err := demo.Node(nodeName).RestartPlugin(ctx); err != nil {
		t.Fatal(err)
	}

	for _, uid := range prepared {
		if !checkpointHas(t, nodeName, uid) {
			t.Errorf("claim %s lost from the checkpoint across the restart", uid)
		}
		if got := specFilesFor(t, nodeName, uid); !slices.Equal(got, specsBefore[uid]) {
			t.Errorf("claim %s: CDI specs %v before the restart, %v after", uid, specsBefore[uid], got)
		}
	}
	// The slices are republished; compare what they say, not their names.
	if after := nodeSlices(t, ctx, nodeName); !reflect.DeepEqual(slicesBefore, after) {
		t.Errorf("slices differ after the restart:\nbefore %+v\nafter  %+v", slicesBefore, after)
	}

	// The new plugin serves new claims and unprepares the old ones.
	apply(t, ctx, podWithTemplate(ns, request, onNode, "after"))
	waitForPod(t, ctx, ns, "after", "Running", running)
	if err := demo.Client().CoreV1().Pods(ns).Delete(ctx, "before0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		return len(specFilesFor(t, nodeName, prepared[0])) == 0 && !checkpointHas(t, nodeName, prepared[0]), nil
	})
	if err != nil {
		t.Errorf("claim %s prepared before the restart was not unprepared after it", prepared[0])
	}
}

// nodeSlices returns the specs of the node's slices, ordered by their
// first device, with the pool generation (which a restart may bump)
// zeroed.
func nodeSlices(t *testing.T, ctx context.Context, node string) []resourceapi.ResourceSliceSpec {
	t.Helper()
	var specs []resourceapi.ResourceSliceSpec
	err := clustertest.Poll(ctx, 0, func() bool {
		list, err := demo.Client().ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
		if err != nil || len(list.Items) == 0 {
			return false
		}
		specs = nil
		for _, s := range list.Items {
			spec := *s.Spec.DeepCopy()
			spec.Pool.Generation = 0
			specs = append(specs, spec)
		}
		return true
	})
	if err != nil {
		t.Fatalf("no slices for %s: %v", node, err)
	}
	first := func(s resourceapi.ResourceSliceSpec) string {
		if len(s.Devices) > 0 {
			return "d/" + s.Devices[0].Name
		}
		if len(s.SharedCounters) > 0 {
			return "c/" + s.SharedCounters[0].Name
		}
		return ""
	}
	slices.SortFunc(specs, func(a, b resourceapi.ResourceSliceSpec) int { return strings.Compare(first(a), first(b)) })
	return specs
}
