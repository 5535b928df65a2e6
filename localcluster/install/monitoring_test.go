package install

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/gpudra/gpudra/pkg/metrics"
)

// servedMetrics are the metric names the kubelet plugin serves, with the
// suffixes of its histograms' series.
func servedMetrics(t *testing.T) []string {
	t.Helper()
	state := metrics.State{PreparedClaims: 1, PublishedDevices: map[string]int{"gpu": 1}, TaintedDevices: map[string]int{},
		PreparedDevices: []metrics.PreparedDevice{{Namespace: "ns", Pod: "p", Claim: "c", Request: "r", Device: "gpu-0", GPUUUID: "GPU-0"}}}
	p := metrics.NewPlugin(func() metrics.State { return state })
	p.ObservePrepare(0, nil)
	p.ObserveUnprepare(0, nil)
	p.SlicePublishError()
	p.HealthEvent("xid", false)
	families, err := p.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range families {
		out = append(out, f.GetName(), f.GetName()+"_bucket", f.GetName()+"_count", f.GetName()+"_sum")
	}
	return out
}

var metricName = regexp.MustCompile(`\b(gpudra_[a-z_]+|DCGM_FI_[A-Z_]+)\b`)

// checkExpr fails the test when expr names a gpudra metric the plugin
// does not serve (a renamed metric would leave a rule that never fires).
func checkExpr(t *testing.T, where, expr string, served []string) {
	t.Helper()
	names := metricName.FindAllString(expr, -1)
	if len(names) == 0 {
		t.Errorf("%s: %q names no metric", where, expr)
	}
	for _, n := range names {
		if strings.HasPrefix(n, "gpudra_") && !slices.Contains(served, n) {
			t.Errorf("%s: %q names %s, which the plugin does not serve", where, expr, n)
		}
	}
}

// TestRenderMonitoring: the monitoring objects render only when enabled,
// the ServiceMonitor keeps the info metric's labels, and every alert and
// dashboard query names metrics the plugin serves.
func TestRenderMonitoring(t *testing.T) {
	for _, o := range render(t, Options{}) {
		if o.Template == "gpudra/templates/monitoring.yaml" || strings.HasSuffix(o.Template, "monitoring.yaml") {
			t.Fatalf("monitoring object %s rendered by default", o)
		}
	}
	objs := render(t, Options{Values: values(
		"monitoring.serviceMonitor.enabled", true, "monitoring.serviceMonitor.labels", map[string]any{"release": "prom"},
		"monitoring.prometheusRule.enabled", true,
		"monitoring.grafanaDashboard.enabled", true,
	)})
	served := servedMetrics(t)
	var sm, rule *unstructured.Unstructured
	var dashboard *corev1.ConfigMap
	var svc *corev1.Service
	for _, o := range objs {
		switch obj := o.Object.(type) {
		case *unstructured.Unstructured:
			switch obj.GetKind() {
			case "ServiceMonitor":
				sm = obj
			case "PrometheusRule":
				rule = obj
			}
		case *corev1.ConfigMap:
			if obj.Name == "gpudra-dashboard" {
				dashboard = obj
			}
		case *corev1.Service:
			if obj.Name == "gpudra-kubelet-plugin-metrics" {
				svc = obj
			}
		}
	}
	if sm == nil || rule == nil || dashboard == nil || svc == nil {
		t.Fatalf("monitoring objects missing: ServiceMonitor %v, PrometheusRule %v, dashboard %v, Service %v", sm != nil, rule != nil, dashboard != nil, svc != nil)
	}
	if svc.Spec.ClusterIP != corev1.ClusterIPNone || svc.Spec.Selector["app.kubernetes.io/component"] != "kubelet-plugin" {
		t.Errorf("metrics Service %+v, want headless over the kubelet plugin pods", svc.Spec)
	}
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(endpoints) != 1 || endpoints[0].(map[string]any)["honorLabels"] != true || endpoints[0].(map[string]any)["path"] != "/metrics" {
		t.Errorf("ServiceMonitor endpoints %v, want one with honorLabels and /metrics", endpoints)
	}
	if sm.GetLabels()["release"] != "prom" {
		t.Errorf("ServiceMonitor labels %v lack the configured release=prom", sm.GetLabels())
	}

	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	var alerts []string
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			r := r.(map[string]any)
			alerts = append(alerts, r["alert"].(string))
			expr := r["expr"].(string)
			if r["alert"] == "GpudraPluginNotServing" {
				if !strings.Contains(expr, `job="gpudra-kubelet-plugin-metrics"`) {
					t.Errorf("GpudraPluginNotServing %q does not name the ServiceMonitor's job", expr)
				}
				continue
			}
			checkExpr(t, "alert "+r["alert"].(string), expr, served)
		}
	}
	slices.Sort(alerts)
	if want := []string{"GpudraCheckpointAdoptionPending", "GpudraDeviceTainted", "GpudraPluginNotServing", "GpudraPrepareFailures"}; !slices.Equal(alerts, want) {
		t.Errorf("alerts %v, want %v", alerts, want)
	}

	var d struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal([]byte(dashboard.Data["gpudra.json"]), &d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if len(d.Panels) < 5 {
		t.Fatalf("dashboard has %d panels", len(d.Panels))
	}
	joined := false
	for _, p := range d.Panels {
		for _, target := range p.Targets {
			checkExpr(t, "panel "+p.Title, target.Expr, served)
			joined = joined || strings.Contains(target.Expr, "gpudra_prepared_device_info * on(UUID, GPU_I_ID) group_left DCGM_")
		}
	}
	if !joined {
		t.Error("no dashboard panel joins DCGM exporter's series")
	}
}
