package uprun

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpudra/gpudra/localcluster/cluster"
)

func TestMain(m *testing.M) {
	// Run starts the nodes' MPS and IMEX daemons as this binary.
	if code, ok := cluster.Main(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// TestRunRefusesOptions checks the options refused before the cluster
// starts, each error naming its flag.
func TestRunRefusesOptions(t *testing.T) {
	manifests := filepath.Join(t.TempDir(), "pod.yaml")
	if err := os.WriteFile(manifests, []byte(trainPod), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		set  func(*Options)
		want string
	}{
		{"negative real nodes", func(o *Options) { o.RealNodes = -1 }, "--real-nodes -1: want 0 or more"},
		{"more real nodes than the fleet has", func(o *Options) { o.Fleet, o.RealNodes = "dgx-a100-mig", 2 }, "--real-nodes 2: fleet dgx-a100-mig has 1 nodes"},
		{"no settle timeout", func(o *Options) { o.SettleTimeout = 0 }, "--settle-timeout 0s: must be positive"},
		{"a missing chart values file", func(o *Options) { o.ChartValues = "missing.yaml" }, "--chart-values: "},
		{"an unknown fleet", func(o *Options) { o.Fleet = "no-such-fleet" }, "--fleet: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			o.Manifests = manifests
			tc.set(&o)
			res, err := Run(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run: %v, want an error with %q", err, tc.want)
			}
			if res != nil {
				t.Errorf("Run returned a result %+v, want none", res)
			}
		})
	}
}

// TestRunReportsDespiteRefusal runs gpudra-sim as a user did: a manifest
// folder with only a Deployment (once reported before its pods existed),
// and an object in a namespace that does not exist (once the end of the
// run after a minute, with no report). The Deployment's pods are in the
// report and the table, the refused object is named with its file and
// the API server's reason, and the run fails for it.
func TestRunReportsDespiteRefusal(t *testing.T) {
	dir := t.TempDir()
	manifests := filepath.Join(dir, "manifests")
	if err := os.Mkdir(manifests, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"deployment.yaml": `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: gpu}
spec:
  spec:
    devices:
      requests:
      - {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 3
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers:
      - {name: ctr, image: ubuntu:24.04, resources: {claims: [{name: gpu}]}}
      resourceClaims:
      - {name: gpu, resourceClaimTemplateName: gpu}
`,
		// Applied before the Deployment (configuration comes first), so
		// that settling starts right after the Deployment's creation.
		"lost.yaml": `apiVersion: v1
kind: ConfigMap
metadata: {namespace: missing, name: lost}
data: {key: value}
`,
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(manifests, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	reportFile := filepath.Join(dir, "report.json")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout strings.Builder
	start := time.Now()
	_, err := Run(ctx, Options{Fleet: "dgx-a100", Manifests: manifests, Report: reportFile, SettleTimeout: 2 * time.Minute, Stdout: &stdout})
	t.Logf("run took %v; table:\n%s", time.Since(start), stdout.String())
	if err == nil || !strings.Contains(err.Error(), "1 of 3 objects refused") {
		t.Errorf("run: %v; want it to fail for the refused object", err)
	}
	if err != nil && strings.Contains(err.Error(), "not settled") {
		t.Errorf("run: %v; the pods should have settled", err)
	}

	data, err := os.ReadFile(reportFile)
	if err != nil {
		t.Fatalf("no report: %v", err)
	}
	var report cluster.Report
	if err := json.Unmarshal(data, &report); err != nil {
		t.Fatal(err)
	}
	running := 0
	for _, p := range report.Pods {
		if p.Namespace == "default" && strings.HasPrefix(p.Name, "web-") && p.Phase == "Running" &&
			len(p.Containers) == 1 && len(p.Containers[0].DeviceNodes) > 0 {
			// The claim's device, and the device metadata the kubelet
			// plugin helper mounts beside it (KEP-5304).
			var claim, metadata int
			for _, id := range p.Containers[0].CDIDevices {
				switch {
				case strings.HasPrefix(id, "k8s.gpu.nvidia.com/claim="):
					claim++
				case strings.HasPrefix(id, "gpu.nvidia.com/metadata="):
					metadata++
				}
			}
			if claim == 1 && metadata == 1 && len(p.Containers[0].CDIDevices) == 2 {
				running++
			}
		}
	}
	if running != 3 {
		t.Errorf("the report has %d of the Deployment's 3 pods running with a GPU: %+v", running, report.Pods)
	}
	if len(report.Workloads) != 1 || report.Workloads[0].Kind != "Deployment" || report.Workloads[0].Pods != 3 {
		t.Errorf("workloads %+v; want the Deployment with its 3 pods", report.Workloads)
	}
	if len(report.Refused) != 1 {
		t.Fatalf("refused %+v; want the ConfigMap in the missing namespace", report.Refused)
	}
	r := report.Refused[0]
	if r.Kind != "ConfigMap" || r.Namespace != "missing" || r.Name != "lost" || r.Source != filepath.Join(manifests, "lost.yaml")+":1" ||
		!strings.Contains(r.Reason, `namespaces "missing" not found`) {
		t.Errorf("refused %+v; want ConfigMap missing/lost from lost.yaml:1, namespace not found", r)
	}
	table := stdout.String()
	for _, want := range []string{"default/web-", "REFUSED", "ConfigMap missing/lost", `namespaces "missing" not found`, "Deployment default/web"} {
		if !strings.Contains(table, want) {
			t.Errorf("the table lacks %q", want)
		}
	}
}

// oneGPUFleet is a fleet of one node with one GPU; trainPod a pod with a
// claim for one GPU, which its container "ctr" uses (request "gpu").
const (
	oneGPUFleet = "nodes:\n- name: one-gpu\n  gpus: [{model: H100-SXM5-80GB}]\n"
	trainPod    = `apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: gpu}
spec:
  spec:
    devices:
      requests:
      - {name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}
---
apiVersion: v1
kind: Pod
metadata: {name: train}
spec:
  containers:
  - {name: ctr, image: ubuntu:24.04, resources: {claims: [{name: gpu, request: gpu}]}}
  resourceClaims:
  - {name: gpu, resourceClaimTemplateName: gpu}
`
)

// TestRunWithHealthEvents: a one-GPU node whose GPU gets an application
// XID (nothing happens) and then a fatal one while a pod runs on it: the
// report and the table show the pod's container with the GPU Unhealthy
// and the node's device taint. A bad events file fails the run before the
// cluster starts, naming the line and field.
func TestRunWithHealthEvents(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	fleet := write("fleet.yaml", oneGPUFleet)
	manifests := write("pod.yaml", trainPod)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	bad := write("bad.yaml", "- {after: 1s, node: one-gpu, gpu: 1, event: xid:79}\n")
	_, err := Run(ctx, Options{Fleet: fleet, Manifests: manifests, Events: bad, SettleTimeout: time.Minute, Stdout: &strings.Builder{}})
	if err == nil || !strings.Contains(err.Error(), "--events: "+bad+":1: gpu: node one-gpu has GPUs 0 to 0, not 1") {
		t.Errorf("run with a GPU the node lacks: %v", err)
	}

	// Without events the device is Healthy in the pod's status from the
	// start: the plugin's first health report, sent as soon as the
	// kubelet opens the stream, is not Unknown (it was, when the stream
	// opened before the plugin marked its health watcher as running, until
	// the resend ten seconds later).
	healthyReport := filepath.Join(dir, "healthy.json")
	if _, err := Run(ctx, Options{Fleet: fleet, Manifests: manifests, Report: healthyReport, SettleTimeout: time.Minute, Stdout: &strings.Builder{}}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(healthyReport)
	if err != nil {
		t.Fatal(err)
	}
	var healthy cluster.Report
	if err := json.Unmarshal(data, &healthy); err != nil {
		t.Fatal(err)
	}
	if p := healthy.Pods; len(p) != 1 || len(p[0].Containers) != 1 || len(p[0].Containers[0].AllocatedResourcesStatus) != 1 ||
		len(p[0].Containers[0].AllocatedResourcesStatus[0].Resources) != 1 || p[0].Containers[0].AllocatedResourcesStatus[0].Resources[0].Health != "Healthy" {
		t.Errorf("without events: pods %+v; want train with one Healthy device", p)
	}

	events := write("events.yaml", `- {after: 1s, node: one-gpu, gpu: 0, event: xid:13}
- {after: 4s, node: one-gpu, gpu: 0, event: xid:79}
`)
	reportFile := filepath.Join(dir, "report.json")
	var stdout strings.Builder
	if _, err := Run(ctx, Options{Fleet: fleet, Manifests: manifests, Events: events, Report: reportFile, SettleTimeout: 2 * time.Minute, Stdout: &stdout}); err != nil {
		t.Fatalf("run: %v\n%s", err, stdout.String())
	}
	t.Logf("table:\n%s", stdout.String())
	data, err = os.ReadFile(reportFile)
	if err != nil {
		t.Fatal(err)
	}
	var report cluster.Report
	if err := json.Unmarshal(data, &report); err != nil {
		t.Fatal(err)
	}
	if len(report.Pods) != 1 || report.Pods[0].Phase != "Running" || len(report.Pods[0].Containers) != 1 {
		t.Fatalf("pods %+v; want train running", report.Pods)
	}
	status := report.Pods[0].Containers[0].AllocatedResourcesStatus
	if len(status) != 1 || status[0].Name != "claim:gpu/gpu" || len(status[0].Resources) != 1 || status[0].Resources[0].Health != "Unhealthy" {
		t.Errorf("allocatedResourcesStatus %+v; want claim:gpu/gpu with one Unhealthy device", status)
	}
	wantTaint := cluster.DeviceTaintReport{Device: "gpu-0", Key: "gpu.nvidia.com/xid", Value: "79", Effect: "NoSchedule"}
	if len(report.Nodes) != 1 || report.Nodes[0].Name != "one-gpu" || !slices.Contains(report.Nodes[0].DeviceTaints, wantTaint) {
		t.Errorf("nodes %+v; want one-gpu with %+v", report.Nodes, wantTaint)
	}
	for _, want := range []string{"health  claim:gpu/gpu=Unhealthy", "(k8s.gpu.nvidia.com/claim=", "DEVICE TAINTS", "gpu-0 gpu.nvidia.com/xid=79:NoSchedule"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("the table lacks %q", want)
		}
	}
}

// TestRunReportsEvictedPod: the GPU of a running pod falls off the bus;
// its NoExecute taint has the device taint eviction controller delete the
// pod. The pod once vanished from the report; now the report and the
// table show it evicted, with the taint.
func TestRunReportsEvictedPod(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	fleet, manifests := write("fleet.yaml", oneGPUFleet), write("pod.yaml", trainPod)
	events := write("events.yaml", "- {after: 1s, node: one-gpu, gpu: 0, event: gpu-lost}\n")
	reportFile := filepath.Join(dir, "report.json")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, progressOut strings.Builder
	var mu sync.Mutex // the health events' lines come from a goroutine of their own
	progress := func(msg string) {
		mu.Lock()
		defer mu.Unlock()
		progressOut.WriteString(msg + "\n")
	}
	if _, err := Run(ctx, Options{Fleet: fleet, Manifests: manifests, Events: events, Report: reportFile, SettleTimeout: 2 * time.Minute, Stdout: &stdout, Progress: progress}); err != nil {
		t.Fatalf("run: %v\n%s", err, stdout.String())
	}
	t.Logf("progress:\n%stable:\n%s", progressOut.String(), stdout.String())
	// Every long step ends with how long it took, and the last line says
	// what to try next.
	progressLines := strings.Split(strings.TrimSpace(progressOut.String()), "\n")
	for _, want := range []string{"cluster ready in ", "settled in ", "stopped in "} {
		if !strings.Contains(progressOut.String(), want) {
			t.Errorf("no progress line with %q", want)
		}
	}
	if last := progressLines[len(progressLines)-1]; !strings.Contains(last, "next: --keep-running") {
		t.Errorf("last progress line %q; want what to try next", last)
	}
	data, err := os.ReadFile(reportFile)
	if err != nil {
		t.Fatal(err)
	}
	var report cluster.Report
	if err := json.Unmarshal(data, &report); err != nil {
		t.Fatal(err)
	}
	if len(report.Pods) != 1 || report.Pods[0].Name != "train" || report.Pods[0].Evicted == nil {
		t.Fatalf("pods %+v; want train, evicted", report.Pods)
	}
	p := report.Pods[0]
	wantTaint := cluster.DeviceTaintReport{Device: "gpu-0", Key: "gpu.nvidia.com/gpu-lost", Effect: "NoExecute"}
	if ev := p.Evicted; !ev.Deleted || ev.Reason != "DeletionByDeviceTaintManager" || !slices.Equal(ev.Taints, []cluster.DeviceTaintReport{wantTaint}) {
		t.Errorf("evicted %+v; want deleted by DeletionByDeviceTaintManager for %+v", ev, wantTaint)
	}
	if len(p.Claims) != 1 || len(p.Claims[0].Results) != 1 || p.Claims[0].Results[0].Device != "gpu-0" {
		t.Errorf("claims %+v; want the one with gpu-0 the pod had", p.Claims)
	}
	for _, want := range []string{"default/train  Evicted  one-gpu", "DeletionByDeviceTaintManager", "gpu-0 gpu.nvidia.com/gpu-lost=:NoExecute"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("the table lacks %q", want)
		}
	}
}
