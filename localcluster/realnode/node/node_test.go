package node

import (
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpudra/gpudra/pkg/nodemode"

	"github.com/gpudra/gpudra/localcluster/install"
)

func TestMergeValues(t *testing.T) {
	base := map[string]any{"a": map[string]any{"x": 1, "y": 2}, "b": 1, "c": map[string]any{"k": 1}}
	over := map[string]any{"a": map[string]any{"y": 3, "z": 4}, "b": map[string]any{"n": 1}, "c": nil}
	got := MergeValues(base, over)
	want := map[string]any{"a": map[string]any{"x": 1, "y": 3, "z": 4}, "b": map[string]any{"n": 1}, "c": nil}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("MergeValues: %v, want %v", got, want)
	}
	if base["a"].(map[string]any)["y"] != 2 {
		t.Errorf("MergeValues changed its base: %v", base)
	}
}

// TestLayout checks the node's paths and that a socket path of exactly
// 108 bytes is avoided.
func TestLayout(t *testing.T) {
	for _, dir := range []string{"/tmp/gpudra-sim-1/r/0", "/tmp/" + strings.Repeat("d", 20), "/tmp/" + strings.Repeat("d", 23)} {
		l, err := NewLayout(dir)
		if err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
		if n := len(l.registrationSocket("gpu.nvidia.com")); n == 108 {
			t.Errorf("%s: registration socket path of 108 bytes", dir)
		}
		if !strings.HasPrefix(l.PluginsDir(), dir+"/k") || filepath.Base(l.RegistryDir()) != "plugins_registry" {
			t.Errorf("%s: plugins %s, registry %s", dir, l.PluginsDir(), l.RegistryDir())
		}
	}
	if _, err := NewLayout("/tmp/" + strings.Repeat("d", 60)); err == nil {
		t.Error("a node directory too long for the plugin's socket was accepted")
	}
}

// TestChartValuesRender renders the chart with the real node's values and
// checks the DaemonSet the DaemonSet controller gets: simulated GPUs of
// the fleet, host paths under the node directory, the host network with
// the API server on loopback, the image as imported, and only real nodes
// selected.
func TestChartValuesRender(t *testing.T) {
	l, err := NewLayout("/tmp/gpudra-sim-1/r/0")
	if err != nil {
		t.Fatal(err)
	}
	values, err := ChartValues(l, "dgx-a100-mig", "https://127.0.0.1:41234")
	if err != nil {
		t.Fatal(err)
	}
	r, err := install.Render(install.Options{Values: MergeValues(map[string]any{"driverName": "gpu.nvidia.com"}, values)})
	if err != nil {
		t.Fatal(err)
	}
	var ds *appsv1.DaemonSet
	for _, o := range r.Objects {
		if d, ok := o.Object.(*appsv1.DaemonSet); ok {
			ds = d
		}
	}
	if ds == nil {
		t.Fatal("no DaemonSet rendered")
	}
	spec := ds.Spec.Template.Spec
	c := spec.Containers[0]
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--fleet=dgx-a100-mig", "--sim-state-dir=" + l.SimStateDir(), "--registrar-dir=" + l.RegistryDir(),
		"--plugin-data-dir=" + filepath.Join(l.PluginsDir(), "gpu.nvidia.com"), "--cdi-dir=" + l.CDIDir(), "--mps-launcher=process", "--vfio=off"} {
		if !strings.Contains(args, want) {
			t.Errorf("plugin args lack %s: %s", want, args)
		}
	}
	// The chart's default affinity (NVIDIA's feature labels) is gone; what
	// is left is the chart's own node mode requirement, which an
	// unlabelled real node meets.
	onlyMode := []corev1.NodeSelectorRequirement{{Key: nodemode.Label, Operator: corev1.NodeSelectorOpNotIn, Values: []string{nodemode.ModeDevicePlugin}}}
	a := spec.Affinity
	if !spec.HostNetwork || spec.NodeSelector[Label] != "true" || a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil ||
		len(a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms) != 1 ||
		!reflect.DeepEqual(a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions, onlyMode) {
		t.Errorf("hostNetwork %v, nodeSelector %v, affinity %v; want the node mode requirement alone", spec.HostNetwork, spec.NodeSelector, spec.Affinity)
	}
	if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool { return tl == Toleration }) {
		t.Errorf("tolerations %v do not tolerate %v", spec.Tolerations, Taint)
	}
	if c.Image != ImageRepository+":"+ImageTag || c.ImagePullPolicy != corev1.PullNever {
		t.Errorf("image %s (%s)", c.Image, c.ImagePullPolicy)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
	}
	if env["KUBERNETES_SERVICE_HOST"] != "127.0.0.1" || env["KUBERNETES_SERVICE_PORT"] != "41234" {
		t.Errorf("env %v", env)
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil && !strings.HasPrefix(v.HostPath.Path, "/tmp/gpudra-sim-1/r/0/") && v.HostPath.Path != "/proc" {
			t.Errorf("volume %s: host path %s outside the node directory", v.Name, v.HostPath.Path)
		}
	}
	if len(spec.Containers) != 1 {
		t.Errorf("%d containers, want the plugin only (no ComputeDomain plugin)", len(spec.Containers))
	}
}
