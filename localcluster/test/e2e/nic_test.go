package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/explain"

	"github.com/gpudra/gpudra/localcluster/simnic"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

const pcieRootAttr = "resource.kubernetes.io/pcieRoot"

// TestGPUNICPairing: a claim for a GPU and a NIC under one PCIe root, across
// gpudra and the simulated NIC driver, stays Pending with the scheduler's
// reason while every free GPU's root has no free NIC (holder pods take the
// NICs under half of each node's roots and the GPUs under the other half);
// `gpudra explain` names the pcieRoot constraint as what fails; once the
// holders go, the pod runs with a GPU and a NIC that share a root.
func TestGPUNICPairing(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	const ns = "gpu-nic-pairing"
	t.Cleanup(func() { deleteNamespacesNamed(t, ns) })

	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n", ns)
	holders := 0
	for node, roots := range nicRoots(t, ctx) {
		// NICs under the first half of the roots are held, GPUs under
		// the second half: no free GPU shares a root with a free NIC.
		nicRoots, gpuRoots := roots[:len(roots)/2], roots[len(roots)/2:]
		gpus := countDevices(t, ctx, node, "gpu.nvidia.com", "gpu", gpuRoots)
		nics := countDevices(t, ctx, node, simnic.DefaultDriverName, simnic.TypeNIC, nicRoots)
		if nics == 0 {
			t.Fatalf("%s: no NIC under %v to hold", node, nicRoots)
		}
		// A node may have no whole GPU under those roots (dgx-h100-1's
		// GPUs 4-7 are in MIG mode): nothing to hold there.
		gpuRequest := ""
		if gpus > 0 {
			gpuRequest = fmt.Sprintf(`    - name: gpus
      exactly:
        deviceClassName: gpu.nvidia.com
        count: %d
        selectors: [{cel: {expression: 'device.attributes["resource.kubernetes.io"].pcieRoot in %s'}}]
`, gpus, celList(gpuRoots))
		}
		fmt.Fprintf(&b, `---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {namespace: %[1]s, name: hold-%[2]s}
spec:
  devices:
    requests:
%[3]s    - name: nics
      exactly:
        deviceClassName: %[4]s
        count: %[5]d
        selectors: [{cel: {expression: 'device.attributes["resource.kubernetes.io"].pcieRoot in %[6]s'}}]
---
apiVersion: v1
kind: Pod
metadata: {namespace: %[1]s, name: holder-%[2]s}
spec:
  nodeSelector: {kubernetes.io/hostname: %[2]s}
  containers:
  - name: ctr
    image: ubuntu:24.04
    resources: {claims: [{name: hold}]}
  resourceClaims:
  - name: hold
    resourceClaimName: hold-%[2]s
`, ns, node, gpuRequest, simnic.DefaultDriverName, nics, celList(nicRoots))
		holders++
	}
	if holders == 0 {
		t.Fatal("no node publishes NICs")
	}
	apply(t, ctx, b.String())
	pods, err := demo.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		waitForPod(t, ctx, ns, p.Name, "running", running)
	}

	pair := clustertest.Spec(clustertest.Request("gpu", "gpu.nvidia.com"), clustertest.Request("nic", simnic.DefaultDriverName))
	pair.Devices.Constraints = []resourceapi.DeviceConstraint{{Requests: []string{"gpu", "nic"}, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(pcieRootAttr))}}
	create(t, ctx, demo, clustertest.ClaimTemplate(ns, "pair", pair), clustertest.Pod(ns, "pair", clustertest.PodClaim{Template: "pair"}))
	pod := waitForPod(t, ctx, ns, "pair", "unschedulable", func(p *corev1.Pod) bool { return reasonOf(p) != "" })
	if pod.Spec.NodeName != "" || !strings.Contains(reasonOf(pod), "cannot allocate all claims") {
		t.Fatalf("pod on %q, reason %q: want it pending for its claim", pod.Spec.NodeName, reasonOf(pod))
	}

	rep, err := explain.Explain(ctx, demo.Client(), explain.Target{Kind: explain.KindPod, Namespace: ns, Name: "pair"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gpudra explain:\n%s", explain.Text(rep))
	if rep.Verdict != explain.VerdictFails || len(rep.Claims) != 1 {
		t.Fatalf("verdict %s with %d claims, want fails with 1", rep.Verdict, len(rep.Claims))
	}
	cons := rep.Claims[0].Constraints
	if len(cons) != 1 || cons[0].Kind != "matchAttribute" || cons[0].Attribute != pcieRootAttr || cons[0].Status != explain.StatusFails ||
		!strings.Contains(cons[0].Reason, "that all share one value of "+pcieRootAttr) {
		t.Errorf("constraints %+v: want the %s constraint named as failing", cons, pcieRootAttr)
	}
	for _, r := range rep.Claims[0].Requests {
		if r.Status != explain.StatusOK {
			t.Errorf("request %s: %s (%s), want each request to fit by itself", r.Name, r.Status, r.Reason)
		}
	}

	// The holders go: the pair is placed.
	for _, p := range pods.Items {
		if err := demo.Client().CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
		claim := "hold-" + strings.TrimPrefix(p.Name, "holder-")
		if err := demo.Client().ResourceV1().ResourceClaims(ns).Delete(ctx, claim, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod = waitForPod(t, ctx, ns, "pair", "running", running)
	devs := devicesOf(t, ctx, pod)
	types := map[string]string{}
	for _, d := range devs {
		types[attr(d, "type")] = attr(d, pcieRootAttr)
	}
	if len(devs) != 2 || types["gpu"] == "" || types["gpu"] != types["nic"] {
		t.Errorf("devices %v by type with their PCIe roots %v: want a GPU and a NIC under one root", deviceNames(devs), types)
	}
	checkContainersSeeDevices(t, pod, devs)
}

// nicRoots returns, for each node that publishes NICs of the simulated NIC
// driver, the PCIe roots of its NICs, sorted.
func nicRoots(t *testing.T, ctx context.Context) map[string][]string {
	t.Helper()
	list, err := demo.Client().ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, s := range list.Items {
		if s.Spec.Driver != simnic.DefaultDriverName {
			continue
		}
		node := ptr.Deref(s.Spec.NodeName, "")
		for _, d := range s.Spec.Devices {
			if r := attr(d, pcieRootAttr); !slices.Contains(out[node], r) {
				out[node] = append(out[node], r)
			}
		}
		slices.Sort(out[node])
	}
	return out
}

// countDevices counts the devices of a driver on a node with the given
// type under one of the roots.
func countDevices(t *testing.T, ctx context.Context, node, driver, typ string, roots []string) int {
	t.Helper()
	list, err := demo.Client().ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range list.Items {
		if s.Spec.Driver != driver {
			continue
		}
		for _, d := range s.Spec.Devices {
			if attr(d, "type") == typ && slices.Contains(roots, attr(d, pcieRootAttr)) {
				n++
			}
		}
	}
	return n
}

// celList renders strings as a CEL list literal.
func celList(values []string) string {
	quoted := make([]string, len(values))
	for i, v := range values {
		quoted[i] = fmt.Sprintf("%q", v)
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

func deviceNames(devs []resourceapi.Device) []string {
	names := make([]string, len(devs))
	for i, d := range devs {
		names[i] = d.Name
	}
	return names
}
