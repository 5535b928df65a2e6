package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/explain"
)

// TestExplainNamesTheFailingRequest: `gpudra explain`'s package, run
// against the local cluster's API server, names the request of a pending
// pod that the real scheduler cannot place, and why: 9 GPUs where no node
// has that many, and a MIG profile no GPU offers (with the nearest
// device).
func TestExplainNamesTheFailingRequest(t *testing.T) {
	ctx := testContext(t, time.Minute)
	apply(t, ctx, podWithTemplate("explain-nine", `        exactly:
          deviceClassName: gpu.nvidia.com
          count: 9`, "", "pod"))
	apply(t, ctx, podWithTemplate("explain-mig", `        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel: {expression: "device.attributes['gpu.nvidia.com'].profile == '1g.23gb'"}`, "", "pod"))
	for _, ns := range []string{"explain-nine", "explain-mig"} {
		pod := waitForPod(t, ctx, ns, "pod", "unschedulable", func(p *corev1.Pod) bool { return reasonOf(p) != "" })
		if pod.Spec.NodeName != "" || !strings.Contains(reasonOf(pod), "cannot allocate all claims") {
			t.Fatalf("%s/pod on %q, reason %q: want it pending for its claim", ns, pod.Spec.NodeName, reasonOf(pod))
		}
		t.Cleanup(func() {
			_ = demo.Client().CoreV1().Pods(ns).Delete(context.Background(), "pod", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		})
	}

	// What the reason must say, counted here from the published slices.
	total, most, mostNode := gpusPerNode(t, ctx)
	rep, err := explain.Explain(ctx, demo.Client(), explain.Target{Kind: explain.KindPod, Namespace: "explain-nine", Name: "pod"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Verdict != explain.VerdictFails || !strings.Contains(rep.SchedulerMessage, "cannot allocate all claims") {
		t.Errorf("verdict %s, scheduler message %q", rep.Verdict, rep.SchedulerMessage)
	}
	want := fmt.Sprintf("asks for 9 devices of class gpu.nvidia.com; the cluster has %d, at most %d on one node (%s); 0 nodes can satisfy it", total, most, mostNode)
	if r := rep.Claims[0].Requests[0]; r.Name != "dev" || r.Status != explain.StatusFails || r.Reason != want {
		t.Errorf("request %s %s: %q\nwant %q\n%s", r.Name, r.Status, r.Reason, want, explain.Text(rep))
	}
	t.Logf("gpudra explain:\n%s", explain.Text(rep))

	rep, err = explain.Explain(ctx, demo.Client(), explain.Target{Kind: explain.KindPod, Namespace: "explain-mig", Name: "pod"})
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Claims[0].Requests[0]
	// dgx-h100-1 creates MIG devices on demand, every H100 profile at
	// every placement: 1g.20gb is the nearest to 1g.23gb.
	const prefix = `no device of class mig.nvidia.com has profile == "1g.23gb"; nearest: `
	if r.Name != "dev" || r.Status != explain.StatusFails || !strings.HasPrefix(r.Reason, prefix) || !strings.HasSuffix(r.Reason, " on dgx-h100-1 (profile 1g.20gb)") {
		t.Errorf("request %s %s: %q, want %q... on dgx-h100-1 (profile 1g.20gb)\n%s", r.Name, r.Status, r.Reason, prefix, explain.Text(rep))
	}
	if len(r.Clauses) != 1 || r.Clauses[0].Passed != 0 || !strings.Contains(strings.Join(r.Clauses[0].Values, " "), "1g.20gb") {
		t.Errorf("clauses %+v: want the profile clause, passed by none, with the profiles published", r.Clauses)
	}
	t.Logf("gpudra explain:\n%s", explain.Text(rep))
}

// gpusPerNode counts the whole GPUs the nodes publish: in all, and the
// most on one node (the first such node by name).
func gpusPerNode(t *testing.T, ctx context.Context) (total, most int, mostNode string) {
	t.Helper()
	slices, err := demo.Client().ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	perNode := map[string]int{}
	for _, s := range slices.Items {
		for _, d := range s.Spec.Devices {
			if attr(d, "type") == "gpu" {
				perNode[ptr.Deref(s.Spec.NodeName, "")]++
				total++
			}
		}
	}
	for _, n := range demo.SimNodes() {
		if c := perNode[n.Name()]; c > most || (c == most && n.Name() < mostNode) {
			most, mostNode = c, n.Name()
		}
	}
	return total, most, mostNode
}
