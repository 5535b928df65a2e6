package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// devicePluginFleet mixes the two modes: a DGX-like node in gpudra's
// device-plugin mode with its defaults, a DRA node, a device-plugin node
// with the mixed MIG strategy and time-sliced full GPUs (renamed, so they
// are not nvidia.com/gpu), and one with the single strategy, whose MIG
// devices are nvidia.com/gpu.
const devicePluginFleet = `nodes:
- name: dp-classic
  mode: device-plugin
  gpus: [{model: H100-SXM5-80GB}, {model: H100-SXM5-80GB}, {model: H100-SXM5-80GB}, {model: H100-SXM5-80GB}]
- name: dra-node
  gpus: [{model: H100-SXM5-80GB}, {model: H100-SXM5-80GB}]
- name: dp-mixed
  mode: device-plugin
  migMode: static
  devicePlugin:
    version: v1
    flags: {migStrategy: mixed}
    sharing:
      timeSlicing:
        renameByDefault: true
        resources:
        - {name: nvidia.com/gpu, replicas: 2}
  gpus:
  - model: H100-SXM5-80GB
  - model: H100-SXM5-80GB
  - model: H100-SXM5-80GB
    migEnabled: true
    migDevices: [{profile: 1g.10gb, placementStart: 0}, {profile: 1g.10gb, placementStart: 1}, {profile: 3g.40gb, placementStart: 4}]
- name: dp-mps
  mode: device-plugin
  devicePlugin: {version: v1, sharing: {mps: {resources: [{name: nvidia.com/gpu, rename: nvidia.com/gpu.mps, replicas: 2}]}}}
  gpus: [{model: H100-SXM5-80GB}]
- name: dp-single
  mode: device-plugin
  migMode: static
  devicePlugin: {version: v1, flags: {migStrategy: single}}
  gpus:
  - model: H100-SXM5-80GB
    migEnabled: true
    migDevices: [{profile: 2g.20gb, placementStart: 0}, {profile: 2g.20gb, placementStart: 2}]
`

// classicPods is a Deployment of pods written for NVIDIA's device plugin,
// kept off the nodes whose nvidia.com/gpu are MIG devices.
func classicDeployment(ns, name string, replicas int, resource string, extra string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: %[1]s}
---
apiVersion: apps/v1
kind: Deployment
metadata: {namespace: %[1]s, name: %[2]s}
spec:
  replicas: %[3]d
  selector: {matchLabels: {app: %[2]s}}
  template:
    metadata: {labels: {app: %[2]s}}
    spec:
%[5]s      containers:
      - name: ctr
        image: ubuntu:22.04
        command: ["bash", "-c", "nvidia-smi -L; sleep 9999"]
        resources:
          limits: {%[4]s: 1}
`, ns, name, replicas, resource, extra)
}

// podsOf lists the Running pods of a Deployment.
func podsOf(t *testing.T, ctx context.Context, c *cluster.Cluster, ns, app string) []corev1.Pod {
	t.Helper()
	pods, err := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

func waitRunning(t *testing.T, ctx context.Context, c *cluster.Cluster, ns, app string, n int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	clustertest.Eventually(t, ctx, 0, fmt.Sprintf("%d Running pods of %s/%s", n, ns, app), func() bool {
		pods = podsOf(t, ctx, c, ns, app)
		running := 0
		for i := range pods {
			if pods[i].Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return running == n
	})
	return pods
}

// TestDevicePluginMode runs a cluster of its own that mixes device-plugin
// nodes (the kubelet's own device manager in process, gpudra's device
// plugin over its real sockets) with a DRA node, and checks that one
// Deployment asking nvidia.com/gpu runs on both kinds, MIG resources under
// the mixed and single strategies, time-slicing replicas, and a kubelet
// restart that loses no allocation.
func TestDevicePluginMode(t *testing.T) {
	ctx := testContext(t, 4*time.Minute)
	c := startFleet(t, ctx, "device-plugin", devicePluginFleet, cluster.Options{})
	useAsDemo(t, c)

	// Each device-plugin node advertises what its config says.
	for node, want := range map[string]map[string]int64{
		"dp-classic": {"nvidia.com/gpu": 4},
		"dp-mixed":   {"nvidia.com/gpu.shared": 4, "nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-3g.40gb": 1},
		"dp-single":  {"nvidia.com/gpu": 2},
		"dp-mps":     {"nvidia.com/gpu.mps": 2},
		"dra-node":   {"nvidia.com/gpu": 0},
	} {
		n, err := c.Client().CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for res, count := range want {
			q := n.Status.Allocatable[corev1.ResourceName(res)]
			if q.Value() != count {
				t.Errorf("node %s allocatable %s = %s, want %d", node, res, q.String(), count)
			}
		}
	}

	// One Deployment, six pods of nvidia.com/gpu: four GPUs on the
	// device-plugin node, two through DRA.
	notSingle := "      affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: NotIn, values: [dp-single, dp-mps]}]}]}}}\n"
	apply(t, ctx, classicDeployment("classic", "train", 6, "nvidia.com/gpu", notSingle))
	pods := waitRunning(t, ctx, c, "classic", "train", 6)
	perNode := map[string]int{}
	seen := map[string]string{}
	for i := range pods {
		pod := &pods[i]
		perNode[pod.Spec.NodeName]++
		ctrs, ok := c.SimNode(pod.Spec.NodeName).Containers(pod)
		if !ok || len(withoutMetadata(ctrs["ctr"].CDIDevices)) != 1 {
			t.Fatalf("%s on %s: containers %+v", pod.Name, pod.Spec.NodeName, ctrs)
		}
		cdi, nodes := withoutMetadata(ctrs["ctr"].CDIDevices)[0], ctrs["ctr"].DeviceNodes
		switch pod.Spec.NodeName {
		case "dp-classic":
			if !strings.HasPrefix(cdi, "k8s.gpu.nvidia.com/device=gpu-") || pod.Status.ExtendedResourceClaimStatus != nil {
				t.Errorf("%s: CDI device %s, extended claim %+v; want the device plugin's device and no claim", pod.Name, cdi, pod.Status.ExtendedResourceClaimStatus)
			}
		case "dra-node":
			if !strings.HasPrefix(cdi, "k8s.gpu.nvidia.com/claim=") || pod.Status.ExtendedResourceClaimStatus == nil {
				t.Errorf("%s: CDI device %s, extended claim %+v; want a DRA claim", pod.Name, cdi, pod.Status.ExtendedResourceClaimStatus)
			}
		}
		gpuNode := ""
		for _, n := range nodes {
			if strings.HasPrefix(n, "/dev/nvidia") && strings.TrimLeft(strings.TrimPrefix(n, "/dev/nvidia"), "0123456789") == "" {
				gpuNode = n
			}
		}
		key := pod.Spec.NodeName + gpuNode
		if gpuNode == "" || seen[key] != "" {
			t.Errorf("%s: GPU node %q (also given to %q); nodes %v", pod.Name, gpuNode, seen[key], nodes)
		}
		seen[key] = pod.Name
	}
	if perNode["dp-classic"] != 4 || perNode["dra-node"] != 2 {
		t.Errorf("pods per node %v, want 4 on dp-classic and 2 on dra-node", perNode)
	}

	// MIG under the mixed strategy, and time-sliced GPUs: four replicas
	// of two GPUs, spread over both.
	apply(t, ctx, classicDeployment("mixed", "mig", 2, "nvidia.com/mig-1g.10gb", ""))
	for _, pod := range waitRunning(t, ctx, c, "mixed", "mig", 2) {
		ctrs, _ := c.SimNode(pod.Spec.NodeName).Containers(&pod)
		caps := slices.ContainsFunc(ctrs["ctr"].DeviceNodes, func(n string) bool { return strings.HasPrefix(n, "/dev/nvidia-caps/") })
		if pod.Spec.NodeName != "dp-mixed" || !caps {
			t.Errorf("MIG pod %s on %s with nodes %v, want dp-mixed and MIG capability nodes", pod.Name, pod.Spec.NodeName, ctrs["ctr"].DeviceNodes)
		}
	}
	apply(t, ctx, classicDeployment("sliced", "slices", 4, "nvidia.com/gpu.shared", ""))
	gpus := map[string]int{}
	for _, pod := range waitRunning(t, ctx, c, "sliced", "slices", 4) {
		ctrs, _ := c.SimNode(pod.Spec.NodeName).Containers(&pod)
		gpus[strings.Join(withoutMetadata(ctrs["ctr"].CDIDevices), ",")]++
	}
	if len(gpus) != 2 || gpus[firstKey(gpus)] != 2 {
		t.Errorf("four time slices over %v, want two on each of two GPUs", gpus)
	}

	// MPS replicas: two pods on one GPU, each a client of the GPU's MPS
	// daemon through its pipe directory.
	apply(t, ctx, classicDeployment("mps", "clients", 2, "nvidia.com/gpu.mps", ""))
	for _, pod := range waitRunning(t, ctx, c, "mps", "clients", 2) {
		ctrs, _ := c.SimNode(pod.Spec.NodeName).Containers(&pod)
		got := ctrs["ctr"]
		if pod.Spec.NodeName != "dp-mps" || len(got.CDIDevices) != 1 || got.CDIDevices[0] != "k8s.gpu.nvidia.com/device=gpu-0-mps" ||
			got.Env["CUDA_MPS_PIPE_DIRECTORY"] != "/tmp/nvidia-mps" || !slices.Contains(got.Mounts, "/tmp/nvidia-mps") {
			t.Errorf("MPS pod %s on %s: %+v; want gpu-0-mps with the daemon's pipe directory", pod.Name, pod.Spec.NodeName, got)
		}
	}

	// Single strategy: the MIG devices are nvidia.com/gpu.
	apply(t, ctx, classicDeployment("single", "mig", 2, "nvidia.com/gpu", "      nodeSelector: {kubernetes.io/hostname: dp-single}\n"))
	for _, pod := range waitRunning(t, ctx, c, "single", "mig", 2) {
		ctrs, _ := c.SimNode(pod.Spec.NodeName).Containers(&pod)
		if cdi := ctrs["ctr"].CDIDevices; len(cdi) != 1 || !strings.Contains(cdi[0], "-mig-2g20gb-") {
			t.Errorf("single-strategy pod %s: CDI devices %v, want a 2g.20gb MIG device", pod.Name, cdi)
		}
	}

	// A kubelet restart: the plugin registers again and running pods keep
	// their GPUs; a replacement pod gets the GPU its predecessor freed,
	// not one a running pod holds.
	node := c.SimNode("dp-classic")
	before := node.DevicePlugin().Registrations()
	if err := node.RestartKubelet(); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, ctx, 0, "the device plugin registers again", func() bool { return node.DevicePlugin().Registrations() > before })
	var victim *corev1.Pod
	held := map[string]bool{}
	for i := range pods {
		if pods[i].Spec.NodeName != "dp-classic" {
			continue
		}
		ctrs, _ := node.Containers(&pods[i])
		if victim == nil {
			victim = &pods[i]
			continue
		}
		held[ctrs["ctr"].CDIDevices[0]] = true
	}
	if err := c.Client().CoreV1().Pods("classic").Delete(ctx, victim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, ctx, 0, "the replacement pod runs", func() bool {
		for _, p := range podsOf(t, ctx, c, "classic", "train") {
			if p.Name != victim.Name && p.Status.Phase == corev1.PodRunning && !slices.ContainsFunc(pods, func(q corev1.Pod) bool { return q.Name == p.Name }) {
				ctrs, ok := c.SimNode(p.Spec.NodeName).Containers(&p)
				if !ok {
					return false
				}
				if p.Spec.NodeName == "dp-classic" && held[ctrs["ctr"].CDIDevices[0]] {
					t.Fatalf("after the kubelet restart the replacement got %s, which a running pod holds", ctrs["ctr"].CDIDevices[0])
				}
				return true
			}
		}
		return false
	})

	migrateToDRA(t, ctx, c, notSingle)
}

// TestDevicePluginMode's last step, on its cluster: the device-plugin
// node is drained and moved to DRA, and the same Deployment runs there
// through DRA.
func migrateToDRA(t *testing.T, ctx context.Context, c *cluster.Cluster, notSingle string) {
	t.Helper()
	if err := c.Client().CoreV1().Namespaces().Delete(ctx, "classic", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	clustertest.Eventually(t, ctx, 0, "the classic namespace's pods to go (the drain)", func() bool {
		return len(podsOf(t, ctx, c, "classic", "train")) == 0
	})
	if err := c.SimNode("dp-classic").MigrateToDRA(ctx); err != nil {
		t.Fatal(err)
	}
	apply(t, ctx, classicDeployment("after", "train", 6, "nvidia.com/gpu", notSingle))
	perNode := map[string]int{}
	for _, pod := range waitRunning(t, ctx, c, "after", "train", 6) {
		perNode[pod.Spec.NodeName]++
		ctrs, _ := c.SimNode(pod.Spec.NodeName).Containers(&pod)
		cdi := withoutMetadata(ctrs["ctr"].CDIDevices)
		if pod.Status.ExtendedResourceClaimStatus == nil || len(cdi) != 1 || !strings.HasPrefix(cdi[0], "k8s.gpu.nvidia.com/claim=") {
			t.Errorf("after the migration %s on %s: extended claim %+v, CDI devices %v; want a DRA claim", pod.Name, pod.Spec.NodeName, pod.Status.ExtendedResourceClaimStatus, ctrs["ctr"].CDIDevices)
		}
	}
	if perNode["dp-classic"] != 4 || perNode["dra-node"] != 2 {
		t.Errorf("after the migration, pods per node %v, want 4 on the migrated node and 2 on dra-node", perNode)
	}
}

func firstKey(m map[string]int) string {
	for k := range m {
		return k
	}
	return ""
}
