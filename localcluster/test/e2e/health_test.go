package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpudra/gpudra/pkg/hardware/sim"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// healthFleet is one node with three GPUs: enough to show a tainted GPU
// left free while the others are allocated. Each GPU is published as
// gpu-<minor> and, for passthrough, gpu-vfio-<minor>.
const healthFleet = `nodes:
- name: health-0
  gpus: [{model: H100-SXM5-80GB}, {model: H100-SXM5-80GB}, {model: H100-SXM5-80GB}]
`

const healthNode = "health-0"

// gpuTemplate is a namespace with a claim template for one GPU, whose
// request is named "gpu".
func gpuTemplate(ns string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: %[1]s}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {namespace: %[1]s, name: one-gpu}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.nvidia.com}
`, ns)
}

// gpuPod is a pod with a GPU from gpuTemplate: its container's
// allocatedResourcesStatus entry is "claim:dev/gpu".
func gpuPod(ns, name string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {namespace: %s, name: %s}
spec:
  containers:
  - name: ctr
    image: ubuntu:24.04
    resources:
      claims: [{name: dev, request: gpu}]
  resourceClaims:
  - name: dev
    resourceClaimTemplateName: one-gpu
`, ns, name)
}

// sliceTaints returns the taints of the node's devices in the API server,
// by device name, as "key=value:effect" joined by commas ("" untainted).
func sliceTaints(t *testing.T, ctx context.Context, c *cluster.Cluster, node string) map[string]string {
	t.Helper()
	list, err := c.Client().ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range list.Items {
		if s.Spec.NodeName == nil || *s.Spec.NodeName != node {
			continue
		}
		for _, d := range s.Spec.Devices {
			var parts []string
			for _, taint := range d.Taints {
				parts = append(parts, fmt.Sprintf("%s=%s:%s", taint.Key, taint.Value, taint.Effect))
			}
			out[d.Name] = strings.Join(parts, ",")
		}
	}
	return out
}

// waitTaints polls the API server every 10 ms until cond holds for the
// node's taints, and returns how long that took.
func waitTaints(t *testing.T, ctx context.Context, c *cluster.Cluster, what string, cond func(map[string]string) bool) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(10 * time.Second)
	for {
		taints := sliceTaints(t, ctx, c, healthNode)
		if cond(taints) {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not in the API server within 10 s; taints now %v", what, taints)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// resourceHealth returns the health the pod's container "ctr" shows for
// its claim's request "gpu", "" while it shows none.
func resourceHealth(p *corev1.Pod) corev1.ResourceHealthStatus {
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name != "ctr" {
			continue
		}
		for _, rs := range cs.AllocatedResourcesStatus {
			if rs.Name == "claim:dev/gpu" && len(rs.Resources) == 1 {
				return rs.Resources[0].Health
			}
		}
	}
	return ""
}

// scrape reads the node's metrics over HTTP.
func scrape(t *testing.T, c *cluster.Cluster, node string) string {
	t.Helper()
	resp, err := http.Get(c.SimNode(node).MetricsURL())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %v: %s", c.SimNode(node).MetricsURL(), resp.Status, err, body)
	}
	return string(body)
}

// checkInfoMetric checks that the pod's node serves
// gpudra_prepared_device_info for the pod with the GPU's UUID, and for a
// MIG device its UUID and GPU instance ID, as DCGM exporter labels them.
func checkInfoMetric(t *testing.T, ctx context.Context, pod *corev1.Pod, gpu, mig, giID string) {
	t.Helper()
	want := []string{`pod="` + pod.Name + `"`, `namespace="` + pod.Namespace + `"`, `UUID="` + gpu + `"`, `mig_uuid="` + mig + `"`, `GPU_I_ID="` + giID + `"`}
	var text string
	err := clustertest.Poll(ctx, 30*time.Second, func() bool {
		text = scrape(t, demo, pod.Spec.NodeName)
		for line := range strings.Lines(text) {
			if strings.HasPrefix(line, "gpudra_prepared_device_info{") && !slices.ContainsFunc(want, func(w string) bool { return !strings.Contains(line, w) }) {
				return true
			}
		}
		return false
	})
	if err != nil {
		var lines []string
		for line := range strings.Lines(text) {
			if strings.HasPrefix(line, "gpudra_prepared_device_info") {
				lines = append(lines, line)
			}
		}
		t.Errorf("%s: node %s serves no gpudra_prepared_device_info with %v; it serves:\n%s", pod.Name, pod.Spec.NodeName, want, strings.Join(lines, ""))
	}
}

// TestPluginProbes gets each path docs/guides/metrics.md lists for the plugin's
// HTTP endpoint from every simulated node: the metrics and the probes a
// real node's kubelet and Prometheus use, at the endpoint the report
// gives. A node of gpudra's device plugin serves none.
func TestPluginProbes(t *testing.T) {
	report, err := demo.Report(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(report.Nodes) != len(demo.SimNodes()) {
		t.Fatalf("report has %d nodes, the cluster %d", len(report.Nodes), len(demo.SimNodes()))
	}
	for _, n := range report.Nodes {
		if want := demo.SimNode(n.Name).HTTPEndpoint(); n.HTTPEndpoint != want {
			t.Errorf("node %s: report's endpoint %q, the node's %q", n.Name, n.HTTPEndpoint, want)
		}
		if n.HTTPEndpoint == "" {
			continue
		}
		for path, want := range map[string]string{"/livez": "ok\n", "/healthz": "ok\n", "/readyz": "ok\n", "/metrics": "gpudra_published_devices"} {
			url := n.HTTPEndpoint + path
			resp, err := http.Get(url)
			if err != nil {
				t.Fatal(err)
			}
			body, err := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(body), want) {
				t.Errorf("GET %s (node %s): %s %v, body %.200q; want 200 with %q", url, n.Name, resp.Status, err, body, want)
			}
		}
	}
}

// metricValue returns the value of the sample with exactly this name and
// labels, and false if the scrape has none.
func metricValue(text, sample string) (float64, bool) {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	return v, err == nil
}

// TestDeviceHealth runs a cluster of its own with one three-GPU node and
// follows a GPU through a fatal XID, recovery and falling off the bus:
// the taint in the API server (timed), where the scheduler puts new
// claims, the health in the running pod's container status, the
// device-taint eviction of a lost GPU's pod, and the node's metrics
// scraped over HTTP.
func TestDeviceHealth(t *testing.T) {
	ctx := testContext(t, 4*time.Minute)
	c := startFleet(t, ctx, "health", healthFleet, cluster.Options{})
	useAsDemo(t, c)
	for gpu := range 3 {
		if !c.HealthWatched(healthNode, gpu) {
			clustertest.Eventually(t, ctx, 0, fmt.Sprintf("the plugin watches GPU %d", gpu), func() bool { return c.HealthWatched(healthNode, gpu) })
		}
	}
	inject := func(gpu int, event string) time.Time {
		t.Helper()
		e, err := sim.ParseHealthEvent(event)
		if err != nil {
			t.Fatal(err)
		}
		at := time.Now()
		if err := c.InjectHealth(healthNode, gpu, e); err != nil {
			t.Fatal(err)
		}
		return at
	}
	// gpuOf returns the device and NVML index of the pod's GPU.
	gpuOf := func(p *corev1.Pod) (string, int) {
		t.Helper()
		devs := devicesOf(t, ctx, p)
		if len(devs) != 1 {
			t.Fatalf("pod %s has devices %v, want one GPU", p.Name, devs)
		}
		index, err := strconv.Atoi(attr(devs[0], "index"))
		if err != nil {
			t.Fatalf("device %s: index attribute: %v", devs[0].Name, err)
		}
		return devs[0].Name, index
	}
	const ns = "health"
	prepares := 0

	// A running pod's GPU fails with a fatal XID.
	apply(t, ctx, gpuTemplate(ns)+"---\n"+gpuPod(ns, "a"))
	prepares++
	a := waitForPod(t, ctx, ns, "a", "running, its GPU healthy", func(p *corev1.Pod) bool {
		return running(p) && resourceHealth(p) == corev1.ResourceHealthStatusHealthy
	})
	badDev, badGPU := gpuOf(a)
	xid79 := "gpu.nvidia.com/xid=79:NoSchedule"
	injected := inject(badGPU, "xid:79")
	took := waitTaints(t, ctx, c, "xid 79 taint on "+badDev, func(m map[string]string) bool { return m[badDev] == xid79 })
	// A figure for the log, not a pass/fail: on a loaded machine it varies
	// (docs/guides/health.md has the measurements).
	t.Logf("fatal XID injected -> %s tainted in the API server: %v", badDev, took)
	// Every device of the GPU (the node offers each GPU for passthrough
	// too, as gpu-vfio-<minor>) and none of the others.
	badVFIO := "gpu-vfio-" + strings.TrimPrefix(badDev, "gpu-")
	taints := sliceTaints(t, ctx, c, healthNode)
	for name, taint := range taints {
		if want := map[bool]string{true: xid79}[name == badDev || name == badVFIO]; taint != want {
			t.Errorf("%s has taints %q, want %q", name, taint, want)
		}
	}
	waitForPod(t, ctx, ns, "a", "shows its GPU Unhealthy", func(p *corev1.Pod) bool {
		return resourceHealth(p) == corev1.ResourceHealthStatusUnhealthy
	})
	t.Logf("fatal XID injected -> pod a's container status Unhealthy: %v", time.Since(injected))
	if v, ok := metricValue(scrape(t, c, healthNode), `gpudra_tainted_devices{effect="NoSchedule"}`); !ok || v != 2 {
		t.Errorf("gpudra_tainted_devices{effect=\"NoSchedule\"} = %v (present %v), want 2 (%s, %s)", v, ok, badDev, badVFIO)
	}

	// With a's pod gone, the tainted GPU is free, and new claims go
	// around it: two pods get the other two GPUs, a third waits.
	if err := c.Client().CoreV1().Pods(ns).Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitGone(t, ctx, c, ns, "a")
	apply(t, ctx, gpuPod(ns, "b")+"---\n"+gpuPod(ns, "c"))
	prepares += 2
	b := waitForPod(t, ctx, ns, "b", "running", running)
	cPod := waitForPod(t, ctx, ns, "c", "running", running)
	bDev, bGPU := gpuOf(b)
	cDev, _ := gpuOf(cPod)
	if bDev == badDev || cDev == badDev || bDev == cDev {
		t.Errorf("b got %s and c %s; the tainted GPU is %s", bDev, cDev, badDev)
	}
	apply(t, ctx, gpuPod(ns, "d"))
	d := waitForPod(t, ctx, ns, "d", "pending with the scheduler's reason", func(p *corev1.Pod) bool { return reasonOf(p) != "" })
	if running(d) || d.Spec.NodeName != "" {
		t.Errorf("pod d was scheduled (node %q) while the only free GPU is tainted", d.Spec.NodeName)
	}
	t.Logf("pod d waits: %s", reasonOf(d))

	// An application XID on b's GPU changes nothing.
	inject(bGPU, "xid:13")
	time.Sleep(2 * time.Second) // more than the plugin's debounce and a health report
	if taints := sliceTaints(t, ctx, c, healthNode); taints[bDev] != "" || taints[badDev] != xid79 {
		t.Errorf("after an application XID on %s: taints %v", bDev, taints)
	}
	if h := resourceHealth(getPod(t, ctx, ns, "b")); h != corev1.ResourceHealthStatusHealthy {
		t.Errorf("after an application XID: pod b shows %q, want Healthy", h)
	}

	// Recovery removes the taint, and the waiting pod gets the GPU.
	recovered := inject(badGPU, "recover")
	took = waitTaints(t, ctx, c, "recovery of "+badDev, func(m map[string]string) bool { return m[badDev] == "" })
	t.Logf("recovery injected -> taint gone from the API server: %v", took)
	d = waitForPod(t, ctx, ns, "d", "running on the recovered GPU", running)
	prepares++
	t.Logf("recovery injected -> pod d running: %v", time.Since(recovered))
	if dDev, _ := gpuOf(d); dDev != badDev {
		t.Errorf("pod d got %s, want the recovered %s", dDev, badDev)
	}

	// Every Prepare the test caused on the node succeeded, and no other.
	text := scrape(t, c, healthNode)
	if v, ok := metricValue(text, `gpudra_prepare_duration_seconds_count{result="success"}`); !ok || int(v) != prepares {
		t.Errorf("gpudra_prepare_duration_seconds_count{result=\"success\"} = %v (present %v), want %d", v, ok, prepares)
	}
	if v, ok := metricValue(text, `gpudra_prepare_duration_seconds_count{result="error"}`); ok && v != 0 {
		t.Errorf("gpudra_prepare_duration_seconds_count{result=\"error\"} = %v, want 0", v)
	}
	if v, ok := metricValue(text, `gpudra_tainted_devices{effect="NoSchedule"}`); !ok || v != 0 {
		t.Errorf("after recovery gpudra_tainted_devices{effect=\"NoSchedule\"} = %v (present %v), want 0", v, ok)
	}

	// b's GPU falls off the bus: NoExecute, and the device taint eviction
	// controller evicts b.
	lost := inject(bGPU, "gpu-lost")
	took = waitTaints(t, ctx, c, bDev+" lost", func(m map[string]string) bool {
		return m[bDev] == "gpu.nvidia.com/gpu-lost=:NoExecute"
	})
	t.Logf("GPU lost -> NoExecute taint in the API server: %v", took)
	waitGone(t, ctx, c, ns, "b")
	t.Logf("GPU lost -> pod b evicted and removed: %v", time.Since(lost))
	// By the device taint eviction controller, which says so on the pod.
	clustertest.Eventually(t, ctx, 0, "the DeviceTaintManagerEviction event of pod b", func() bool {
		evs, err := c.Client().CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=b"})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Reason == "DeviceTaintManagerEviction" && e.Message == "Marking for deletion" {
				return true
			}
		}
		return false
	})
	if h := resourceHealth(getPod(t, ctx, ns, "c")); h != corev1.ResourceHealthStatusHealthy {
		t.Errorf("pod c on a healthy GPU shows %q", h)
	}
	if v, ok := metricValue(scrape(t, c, healthNode), `gpudra_tainted_devices{effect="NoExecute"}`); !ok || v != 2 {
		t.Errorf("gpudra_tainted_devices{effect=\"NoExecute\"} = %v (present %v), want 2 (the lost GPU's CUDA and VFIO devices)", v, ok)
	}
	inject(bGPU, "recover")
	waitTaints(t, ctx, c, bDev+" back", func(m map[string]string) bool { return m[bDev] == "" })
}

// waitGone waits until the pod no longer exists.
func waitGone(t *testing.T, ctx context.Context, c *cluster.Cluster, ns, name string) {
	t.Helper()
	clustertest.Eventually(t, ctx, 0, fmt.Sprintf("pod %s/%s gone", ns, name), func() bool {
		_, err := c.Client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}
