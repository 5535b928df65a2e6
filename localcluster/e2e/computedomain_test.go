package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpudra/gpudra/pkg/computedomain"
	"github.com/gpudra/gpudra/pkg/hardware/sim"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/manifests"
)

// cdFleet is two GB200 compute trays of one NVLink clique.
const cdFleet = `
nodes:
- name: nvl-0
  fabric:
    cliqueID: 1
  gpus: [{model: GB200}, {model: GB200}, {model: GB200}, {model: GB200}]
- name: nvl-1
  fabric:
    cliqueID: 1
  gpus: [{model: GB200}, {model: GB200}, {model: GB200}, {model: GB200}]
`

// nvidiaChannelDemo is NVIDIA's IMEX channel injection example (a
// ComputeDomain and a pod using its template), unchanged but for names
// and the node the pod is pinned to.
const nvidiaChannelDemo = `
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata:
  name: %[1]s
  namespace: cd-demo
spec:
  numNodes: 1
  channel:
    resourceClaimTemplate:
      name: %[1]s-channel
---
apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  namespace: cd-demo
spec:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchFields:
          - key: metadata.name
            operator: In
            values: [%[2]s]
  containers:
  - name: ctr
    image: ubuntu:22.04
    command: ["bash", "-c"]
    args: ["ls -la /dev/nvidia-caps-imex-channels; trap 'exit 0' TERM; sleep 9999 & wait"]
    resources:
      claims:
      - name: imex-channel-0
  resourceClaims:
  - name: imex-channel-0
    resourceClaimTemplateName: %[1]s-channel
`

func TestComputeDomainChannels(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	fleet, err := sim.Parse([]byte(cdFleet), "cd-fleet")
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.Start(ctx, cluster.Options{Fleet: fleet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	cds, err := c.StartComputeDomains(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cds.Stop)

	applyTo := func(yamlText string) {
		t.Helper()
		objs, err := manifests.Parse([]byte(yamlText), t.Name())
		if err != nil {
			t.Fatal(err)
		}
		refused, err := c.Apply(ctx, objs)
		if err != nil || len(refused) != 0 {
			t.Fatalf("apply: %v %v", err, refused)
		}
	}
	applyTo("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: cd-demo\n")

	// Two domains, each with a pod on node nvl-0: both run, on different
	// channels; a third pod of the first domain on nvl-1 gets the first
	// domain's channel there too.
	applyTo(fmt.Sprintf(nvidiaChannelDemo, "domain-a", "nvl-0"))
	applyTo(fmt.Sprintf(nvidiaChannelDemo, "domain-b", "nvl-0"))
	channelOf := func(name string) int32 {
		t.Helper()
		var ch int32
		err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
			obj, err := c.Dynamic().Resource(computedomain.GVR).Namespace("cd-demo").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			cd, err := computedomain.FromUnstructured(obj)
			if err != nil || cd.Status.Channel == nil {
				return false, nil
			}
			ch = *cd.Status.Channel
			return true, nil
		})
		if err != nil {
			t.Fatalf("domain %s never got a channel: %v", name, err)
		}
		return ch
	}
	chA, chB := channelOf("domain-a"), channelOf("domain-b")
	if chA == chB {
		t.Fatalf("domains a and b both hold channel %d", chA)
	}
	containerNodes := func(podName, node string) []string {
		t.Helper()
		pod := waitForPodIn(t, ctx, c, "cd-demo", podName)
		if pod.Spec.NodeName != node {
			t.Fatalf("pod %s on %s, want %s", podName, pod.Spec.NodeName, node)
		}
		devs, ok := c.Node(node).Containers(pod)
		if !ok {
			t.Fatalf("node %s has no containers of pod %s", node, podName)
		}
		var out []string
		for _, p := range devs["ctr"].DeviceNodes {
			if strings.HasPrefix(p, "/dev/nvidia-caps-imex-channels/") {
				out = append(out, p)
			}
		}
		return out
	}
	channelPath := func(ch int32) []string { return []string{fmt.Sprintf("/dev/nvidia-caps-imex-channels/channel%d", ch)} }
	if got := containerNodes("domain-a", "nvl-0"); !slices.Equal(got, channelPath(chA)) {
		t.Errorf("domain-a's container: %v, want %v", got, channelPath(chA))
	}
	if got := containerNodes("domain-b", "nvl-0"); !slices.Equal(got, channelPath(chB)) {
		t.Errorf("domain-b's container: %v, want %v", got, channelPath(chB))
	}
	applyTo(strings.Replace(strings.SplitN(fmt.Sprintf(nvidiaChannelDemo, "domain-a", "nvl-1"), "---", 2)[1], "name: domain-a\n", "name: domain-a-1\n", 1))
	if got := containerNodes("domain-a-1", "nvl-1"); !slices.Equal(got, channelPath(chA)) {
		t.Errorf("domain-a's pod on nvl-1: %v, want %v (the same channel on every node)", got, channelPath(chA))
	}

	// Deleting a domain removes its template and, once the controller
	// has cleaned up, the domain itself.
	dyn := c.Dynamic()
	if err := dyn.Resource(computedomain.GVR).Namespace("cd-demo").Delete(ctx, "domain-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		_, errT := c.Client().ResourceV1().ResourceClaimTemplates("cd-demo").Get(ctx, "domain-b-channel", metav1.GetOptions{})
		_, errD := dyn.Resource(computedomain.GVR).Namespace("cd-demo").Get(ctx, "domain-b", metav1.GetOptions{})
		return apierrors.IsNotFound(errT) && apierrors.IsNotFound(errD), nil
	})
	if err != nil {
		t.Errorf("domain-b's template or the domain itself stayed: %v", err)
	}
	for _, name := range []string{"domain-a", "domain-a-1", "domain-b"} {
		if err := c.Client().CoreV1().Pods("cd-demo").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	}
}

func waitForPodIn(t *testing.T, ctx context.Context, c *cluster.Cluster, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		p, err := c.Client().CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pod = p
		return running(p), nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s never ran (phase %s, reason %q): %v", ns, name, phaseOf(pod), reasonOf(pod), err)
	}
	return pod
}
