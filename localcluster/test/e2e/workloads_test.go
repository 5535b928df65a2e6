package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/manifests"
)

// TestWorkloadsSettle: settling waits until the workload controllers have
// made their pods (gpudra-sim once reported before a Deployment's pods
// existed), also a StatefulSet's pods, which come one after the other,
// and the pods a Job runs one after the other; it does not wait for a
// StatefulSet whose next pod waits for one that never becomes ready, nor
// for a DaemonSet, which it reports as unsupported.
func TestWorkloadsSettle(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	objs := loadTestdata(t, "workloads", "workloads.yaml")
	if refused, err := demo.Apply(ctx, objs); err != nil || len(refused) != 0 {
		t.Fatalf("refused %v, error %v", refused, err)
	}
	t.Cleanup(func() { deleteNamespaces(t, objs) })
	if err := demo.WaitSettled(ctx, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	// Right after settling, without waiting any further.
	pods, err := demo.Client().CoreV1().Pods("workloads").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byApp := map[string][]corev1.Pod{}
	for _, p := range pods.Items {
		app := p.Labels["app"]
		if _, ok := p.Labels["batch.kubernetes.io/job-name"]; ok {
			app = "batch"
		}
		byApp[app] = append(byApp[app], p)
	}
	for app, want := range map[string]struct {
		n     int
		phase corev1.PodPhase
	}{"web": {2, corev1.PodRunning}, "db": {2, corev1.PodRunning}, "batch": {2, corev1.PodSucceeded}, "stuck": {1, corev1.PodPending}} {
		got := byApp[app]
		if len(got) != want.n {
			t.Errorf("%s: %d pods, want %d", app, len(got), want.n)
		}
		for _, p := range got {
			if p.Status.Phase != want.phase {
				t.Errorf("%s: pod %s is %s, want %s (reason %q)", app, p.Name, p.Status.Phase, want.phase, reasonOf(&p))
			}
			if want.phase == corev1.PodRunning {
				if devs := devicesOf(t, ctx, &p); len(devs) != 1 {
					t.Errorf("%s: pod %s has %d devices, want 1", app, p.Name, len(devs))
				}
			}
		}
	}
	var dbNames []string
	for _, p := range byApp["db"] {
		dbNames = append(dbNames, p.Name)
	}
	slices.Sort(dbNames)
	if !slices.Equal(dbNames, []string{"db-0", "db-1"}) {
		t.Errorf("StatefulSet pods %v, want db-0 and db-1", dbNames)
	}
	if stuck := byApp["stuck"]; len(stuck) == 1 && reasonOf(&stuck[0]) == "" {
		t.Errorf("pod %s is Pending without the scheduler's reason", stuck[0].Name)
	}

	report, err := demo.Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	workloads := map[string]cluster.WorkloadReport{}
	for _, w := range report.Workloads {
		if w.Namespace == "workloads" {
			workloads[w.Kind+"/"+w.Name] = w
		}
		if w.Kind == "ReplicaSet" && w.Namespace == "workloads" {
			t.Errorf("the report lists %s, which its Deployment controls", w)
		}
	}
	for key, want := range map[string]struct {
		desired, pods int32
		msg           string
	}{
		"Deployment/web":    {2, 2, ""},
		"StatefulSet/db":    {2, 2, ""},
		"Job/batch":         {2, 2, ""},
		"StatefulSet/stuck": {2, 1, "waits until stuck-0 is ready"},
		"DaemonSet/agent":   {0, 0, "no daemonset controller"},
	} {
		w, ok := workloads[key]
		if !ok {
			t.Errorf("the report has no %s; it has %v", key, report.Workloads)
			continue
		}
		if !w.Settled || w.Desired != want.desired || w.Pods != want.pods || !strings.Contains(w.Message, want.msg) {
			t.Errorf("%s: settled %v, %d of %d pods, message %q; want settled, %d of %d, a message with %q",
				key, w.Settled, w.Pods, w.Desired, w.Message, want.pods, want.desired, want.msg)
		}
		if w.Unsupported != (key == "DaemonSet/agent") {
			t.Errorf("%s: unsupported %v", key, w.Unsupported)
		}
	}
}

// TestApplyRefusals: an object the API server refuses (here: in a
// namespace that does not exist, with an invalid name, of a kind it does
// not serve) neither stops the others nor makes the apply wait; each is
// named with its source and the server's reason.
func TestApplyRefusals(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	objs, err := manifests.Parse([]byte(`apiVersion: v1
kind: Namespace
metadata: {name: refusals}
---
apiVersion: v1
kind: Pod
metadata: {namespace: no-such-namespace, name: lost}
spec:
  containers: [{name: ctr, image: ubuntu:24.04}]
---
apiVersion: v1
kind: ConfigMap
metadata: {namespace: refusals, name: Not_A_Name}
---
apiVersion: example.com/v1
kind: Widget
metadata: {namespace: refusals, name: w}
---
apiVersion: v1
kind: Pod
metadata: {namespace: refusals, name: fine}
spec:
  containers: [{name: ctr, image: ubuntu:24.04}]
`), "refusals.yaml")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	refused, err := demo.Apply(ctx, objs)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("apply took %v; a missing namespace must not be waited for", took)
	}
	want := []struct{ kind, ns, name, source, reason string }{
		{"ConfigMap", "refusals", "Not_A_Name", "refusals.yaml:3", "Invalid value"},
		{"Widget", "refusals", "w", "refusals.yaml:4", `no matches for kind "Widget"`},
		{"Pod", "no-such-namespace", "lost", "refusals.yaml:2", `namespaces "no-such-namespace" not found`},
	}
	if len(refused) != len(want) {
		t.Fatalf("refused %v, want %d objects", refused, len(want))
	}
	for i, w := range want {
		r := refused[i]
		if r.Kind != w.kind || r.Namespace != w.ns || r.Name != w.name || r.Source != w.source || !strings.Contains(r.Reason, w.reason) {
			t.Errorf("refusal %d: %+v; want %s %s/%s from %s because %q", i, r, w.kind, w.ns, w.name, w.source, w.reason)
		}
		if s := r.String(); !strings.Contains(s, w.kind+" "+w.ns+"/"+w.name) || !strings.Contains(s, w.source) || !strings.Contains(s, w.reason) {
			t.Errorf("refusal %d reads %q; want kind, namespace/name, source and reason", i, s)
		}
	}
	waitForPod(t, ctx, "refusals", "fine", "Running", running)
}
