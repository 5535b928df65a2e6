package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpudra/gpudra/pkg/computedomain"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
	cdcontroller "github.com/gpudra/gpudra/pkg/computedomain/controller"
)

// cdFleet is two GB200 compute trays of one NVLink clique.
const cdFleet = clustertest.GB200Pair

// misspeltChannelConfig has "domainId" for "domainID".
const misspeltChannelConfig = `{"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig", "domainId": "0b6f4a2e-1c55-4f0e-9b1a-3f1d2c4e5a6b"}`

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

// TestComputeDomainChannels runs NVIDIA's channel demo with the
// ComputeDomain driver installed from the chart (the fleet has a clique):
// its CRDs, classes and RBAC, the controller Deployment's pod and every
// node's compute-domains container.
func TestComputeDomainChannels(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	c := startFleet(t, ctx, "cd-fleet", cdFleet, cluster.Options{})
	applyTo := func(yamlText string) {
		t.Helper()
		applyIn(t, ctx, c, yamlText)
	}
	applyTo("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: cd-demo\n")

	// The webhook validates the channel driver's configs as its plugin
	// decodes them: a misspelt domainID is refused at creation with the
	// plugin's message.
	bad := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "cd-demo", Name: "misspelt-domain"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "channel", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: cdcontroller.ChannelDeviceClass}}},
			Config: []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: computedomain.DriverName, Parameters: runtime.RawExtension{Raw: []byte(misspeltChannelConfig)},
			}}}},
		}},
	}
	_, err := c.Client().ResourceV1().ResourceClaims("cd-demo").Create(ctx, bad, metav1.CreateOptions{})
	if want := `admission webhook "` + webhookName + `" denied the request: spec.devices.config[0].opaque.parameters: ` + pluginMessage(t, misspeltChannelConfig); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a channel claim with domainId for domainID:\n got %v\nwant the refusal %q", err, want)
	}

	// Two domains, each with a pod on node nvl-0: both run, on different
	// channels; a third pod of the first domain on nvl-1 gets the first
	// domain's channel there too.
	applyTo(fmt.Sprintf(nvidiaChannelDemo, "domain-a", "nvl-0"))
	applyTo(fmt.Sprintf(nvidiaChannelDemo, "domain-b", "nvl-0"))
	channelOf := func(name string) int32 {
		t.Helper()
		var ch int32
		err := clustertest.Poll(ctx, 0, func() bool {
			obj, err := c.Dynamic().Resource(computedomain.GVR).Namespace("cd-demo").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			cd, err := computedomain.FromUnstructured(obj)
			if err != nil || cd.Status.Channel == nil {
				return false
			}
			ch = *cd.Status.Channel
			return true
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
		pod := waitForPodIn(t, ctx, c, "cd-demo", podName, "Running", running)
		if pod.Spec.NodeName != node {
			t.Fatalf("pod %s on %s, want %s", podName, pod.Spec.NodeName, node)
		}
		devs, ok := c.SimNode(node).Containers(pod)
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

	// Deleting a domain removes its template at once, and the domain (its
	// channel freed) only once its pod and claim are gone.
	dyn := c.Dynamic()
	if err := dyn.Resource(computedomain.GVR).Namespace("cd-demo").Delete(ctx, "domain-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = clustertest.Poll(ctx, 0, func() bool {
		_, err := c.Client().ResourceV1().ResourceClaimTemplates("cd-demo").Get(ctx, "domain-b-channel", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if err != nil {
		t.Fatalf("domain-b's template stayed: %v", err)
	}
	if _, err := dyn.Resource(computedomain.GVR).Namespace("cd-demo").Get(ctx, "domain-b", metav1.GetOptions{}); err != nil {
		t.Errorf("domain-b went while its pod still holds its channel: %v", err)
	}
	claimUID := claimUIDOf(t, ctx, c, "cd-demo", "domain-b")
	specsOf := func() []string {
		var out []string
		entries, _ := os.ReadDir(c.SimNode("nvl-0").CDIDir())
		for _, e := range entries {
			// The claim's own spec; the helper's device metadata spec
			// (<driver>_metadata_<uid>_<request>.json) comes and goes with it.
			if strings.Contains(e.Name(), claimUID) && !strings.Contains(e.Name(), "_metadata_") {
				out = append(out, e.Name())
			}
		}
		return out
	}
	if len(specsOf()) != 1 {
		t.Errorf("CDI specs of domain-b's claim on nvl-0: %v, want one", specsOf())
	}
	if err := c.Client().CoreV1().Pods("cd-demo").Delete(ctx, "domain-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = clustertest.Poll(ctx, 0, func() bool {
		_, err := dyn.Resource(computedomain.GVR).Namespace("cd-demo").Get(ctx, "domain-b", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if err != nil {
		t.Errorf("domain-b stayed after its pod went: %v", err)
	}
	if left := specsOf(); len(left) != 0 {
		t.Errorf("domain-b's channel is still prepared on nvl-0: %v", left)
	}
	for _, name := range []string{"domain-a", "domain-a-1"} {
		if err := c.Client().CoreV1().Pods("cd-demo").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	}
}

// claimUIDOf returns the UID of the pod's one ResourceClaim.
func claimUIDOf(t *testing.T, ctx context.Context, c *cluster.Cluster, ns, pod string) string {
	t.Helper()
	p, err := c.Client().CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Status.ResourceClaimStatuses) != 1 || p.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("pod %s/%s claims: %+v", ns, pod, p.Status.ResourceClaimStatuses)
	}
	claim, err := c.Client().ResourceV1().ResourceClaims(ns).Get(ctx, *p.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(claim.UID)
}
