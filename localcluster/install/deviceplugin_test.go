package install

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/pkg/nodemode"
	"github.com/gpudra/gpudra/pkg/pluginflags"
)

const devicePluginName = "gpudra-device-plugin"

// devicePluginContainer returns the device-plugin DaemonSet and its
// container, or fails.
func devicePluginContainer(t *testing.T, objs []Object) (*appsv1.DaemonSet, corev1.Container) {
	t.Helper()
	ds := find[*appsv1.DaemonSet](t, objs, devicePluginName)
	if len(ds.Spec.Template.Spec.Containers) != 1 {
		t.Fatalf("device-plugin DaemonSet has %d containers, want 1", len(ds.Spec.Template.Spec.Containers))
	}
	return ds, ds.Spec.Template.Spec.Containers[0]
}

// TestDevicePluginOffByDefault: the chart installs the DRA driver; the
// device plugin is for pools a user moves to it.
func TestDevicePluginOffByDefault(t *testing.T) {
	for _, o := range render(t, Options{}) {
		if strings.Contains(o.Name, "device-plugin") {
			t.Errorf("%s %s rendered with devicePlugin.enabled false", o.Kind, o.Name)
		}
	}
}

// TestDevicePluginDaemonSet: devicePlugin.enabled renders a DaemonSet that
// runs `gpudra device-plugin` with the values' flags and the node's paths
// of kubeletPlugin, its config file from a ConfigMap, without API access.
func TestDevicePluginDaemonSet(t *testing.T) {
	t.Setenv("NODE_NAME", "node-0")
	config := map[string]any{"version": "v1", "flags": map[string]any{"migStrategy": "mixed"},
		"sharing": map[string]any{"timeSlicing": map[string]any{"resources": []any{map[string]any{"name": "nvidia.com/gpu", "replicas": 4}}}}}
	objs := render(t, Options{Values: values(
		"devicePlugin.enabled", true,
		"devicePlugin.deviceListStrategy", []any{"cdi-cri", "envvar"},
		"devicePlugin.config", config,
		"kubeletPlugin.driverRoot", "/run/nvidia/driver",
	)})
	ds, c := devicePluginContainer(t, objs)
	if len(c.Args) == 0 || c.Args[0] != "device-plugin" {
		t.Fatalf("args %q do not start with device-plugin", c.Args)
	}
	if err := pluginflags.CheckDevicePlugin(c.Args[1:]); err != nil {
		t.Errorf("gpudra device-plugin refuses the chart's args: %v", err)
	}
	for flag, want := range map[string]string{
		"driver-name":           "gpu.nvidia.com",
		"driver-root":           "/run/nvidia/driver",
		"container-driver-root": "/driver-root",
		"device-list-strategy":  "cdi-cri,envvar",
		"device-plugin-dir":     "/var/lib/kubelet/device-plugins",
		"dra-plugin-data-dir":   "/var/lib/kubelet/plugins/gpu.nvidia.com",
		"cdi-dir":               "/var/run/cdi",
		"config-file":           "/etc/gpudra/device-plugin/config.yaml",
		"node-name":             "$(NODE_NAME)",
	} {
		if got, ok := flagValue(c.Args, flag); !ok || got != want {
			t.Errorf("--%s=%q (given: %v), want %q", flag, got, ok, want)
		}
	}
	// Unset, so that the config file's flags.migStrategy applies.
	for _, flag := range []string{"mig-strategy", "device-id-strategy", "pass-device-specs", "cdi-annotation-prefix"} {
		if got, ok := flagValue(c.Args, flag); ok {
			t.Errorf("--%s=%q passed though its value is unset: it would override the config file's", flag, got)
		}
	}
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	for _, path := range []string{"/var/lib/kubelet/device-plugins", "/var/run/cdi", "/driver-root", "/etc/gpudra/device-plugin", "/host/sys", "/host/proc"} {
		if _, ok := mounts[path]; !ok {
			t.Errorf("no volume mounted at %s; mounts %v", path, slices.Sorted(maps.Keys(mounts)))
		}
	}
	if m := mounts["/var/lib/kubelet/plugins"]; !m.ReadOnly {
		t.Errorf("the DRA plugins directory is mounted %+v, want read-only (the plugin only looks for the DRA socket)", m)
	}
	spec := ds.Spec.Template.Spec
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the device plugin reads nothing from the API server; its pods should carry no token")
	}
	cm := find[*corev1.ConfigMap](t, objs, devicePluginName)
	var got map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data["config.yaml"]), &got); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(map[string]any{"version": "v1", "flags": map[string]any{"migStrategy": "mixed"},
		"sharing": map[string]any{"timeSlicing": map[string]any{"resources": []any{map[string]any{"name": "nvidia.com/gpu", "replicas": float64(4)}}}}}) {
		t.Errorf("ConfigMap's config.yaml is %v, want devicePlugin.config", got)
	}
	if ds.Spec.Template.Annotations["gpudra.io/device-plugin-config"] == "" {
		t.Error("no config checksum annotation: a changed config would not restart the pods")
	}
}

// TestPluginDaemonSetsNeverShareANode: whatever the user's nodeSelector and
// affinity, the DRA kubelet plugin and the device plugin DaemonSets select
// disjoint nodes, split by the node label nodemode.Label: a node labelled
// device-plugin gets only the device plugin, any other GPU node only the
// DRA plugin.
func TestPluginDaemonSetsNeverShareANode(t *testing.T) {
	gpuLabel := map[string]string{"nvidia.com/gpu.present": "true"}
	node := func(name string, labels ...map[string]string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{}}}
		for _, l := range labels {
			maps.Copy(n.Labels, l)
		}
		return n
	}
	mode := func(m string) map[string]string { return map[string]string{nodemode.Label: m} }
	nodes := []*corev1.Node{
		node("gpu"), node("gpu-dra"), node("gpu-dp"), node("gpu-other-mode"),
		node("pool-a"), node("pool-a-dp"), node("no-gpu"), node("no-gpu-dp"),
	}
	for _, n := range nodes {
		if !strings.HasPrefix(n.Name, "no-gpu") {
			maps.Copy(n.Labels, gpuLabel)
		}
		if strings.HasPrefix(n.Name, "pool-a") {
			n.Labels["pool"] = "a"
		}
		switch {
		case strings.HasSuffix(n.Name, "-dp"):
			maps.Copy(n.Labels, mode(nodemode.ModeDevicePlugin))
		case strings.HasSuffix(n.Name, "-dra"):
			maps.Copy(n.Labels, mode(nodemode.ModeDRA))
		case strings.HasSuffix(n.Name, "-other-mode"):
			maps.Copy(n.Labels, mode("something"))
		}
	}
	var anyNode map[string]any // null: Helm drops the default affinity
	twoTerms := map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
		"nodeSelectorTerms": []any{
			map[string]any{"matchExpressions": []any{map[string]any{"key": "pool", "operator": "In", "values": []any{"a"}}}},
			map[string]any{"matchExpressions": []any{map[string]any{"key": "nvidia.com/gpu.present", "operator": "Exists"}}},
		}}}}
	// A user who selects the other mode's label by hand still gets no node
	// both ways.
	wrongMode := map[string]any{"nodeAffinity": map[string]any{"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{
		"nodeSelectorTerms": []any{map[string]any{"matchExpressions": []any{map[string]any{"key": nodemode.Label, "operator": "Exists"}}}},
	}}}
	preferredOnly := map[string]any{"nodeAffinity": map[string]any{"preferredDuringSchedulingIgnoredDuringExecution": []any{
		map[string]any{"weight": 1, "preference": map[string]any{"matchExpressions": []any{map[string]any{"key": "pool", "operator": "Exists"}}}},
	}}}
	for _, tc := range []struct {
		name   string
		values []any
		// dra and dp are the nodes each DaemonSet runs on; nil: not checked.
		dra, dp []string
	}{
		{name: "defaults", dra: []string{"gpu", "gpu-dra", "gpu-other-mode", "pool-a"}, dp: []string{"gpu-dp", "pool-a-dp"}},
		{name: "no affinity", values: []any{"kubeletPlugin.affinity", anyNode, "devicePlugin.affinity", anyNode},
			dra: []string{"gpu", "gpu-dra", "gpu-other-mode", "pool-a", "no-gpu"}, dp: []string{"gpu-dp", "pool-a-dp", "no-gpu-dp"}},
		{name: "terms ORed", values: []any{"kubeletPlugin.affinity", twoTerms, "devicePlugin.affinity", twoTerms}},
		{name: "node selectors of one pool", values: []any{"kubeletPlugin.nodeSelector", map[string]any{"pool": "a"}, "devicePlugin.nodeSelector", map[string]any{"pool": "a"}},
			dra: []string{"pool-a"}, dp: []string{"pool-a-dp"}},
		{name: "a node selector naming the other mode", values: []any{"kubeletPlugin.nodeSelector", map[string]any{nodemode.Label: nodemode.ModeDevicePlugin}},
			dra: []string{}, dp: []string{"gpu-dp", "pool-a-dp"}},
		{name: "an affinity asking for any mode", values: []any{"kubeletPlugin.affinity", wrongMode, "devicePlugin.affinity", wrongMode}},
		{name: "preferences only", values: []any{"kubeletPlugin.affinity", preferredOnly, "devicePlugin.affinity", preferredOnly}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, Options{Values: values(append([]any{"devicePlugin.enabled", true}, tc.values...)...)})
			selects := func(ds *appsv1.DaemonSet) []string {
				required := nodeaffinity.GetRequiredNodeAffinity(&corev1.Pod{Spec: ds.Spec.Template.Spec})
				out := []string{}
				for _, n := range nodes {
					ok, err := required.Match(n)
					if err != nil {
						t.Fatalf("%s: node affinity: %v", ds.Name, err)
					}
					if ok {
						out = append(out, n.Name)
					}
				}
				return out
			}
			draDS, _ := pluginContainer(t, objs)
			dpDS, _ := devicePluginContainer(t, objs)
			dra, dp := selects(draDS), selects(dpDS)
			for _, n := range dra {
				if slices.Contains(dp, n) {
					t.Errorf("node %s is selected by both the kubelet plugin and the device plugin DaemonSets", n)
				}
			}
			if tc.dra != nil && !slices.Equal(dra, tc.dra) {
				t.Errorf("the kubelet plugin runs on %v, want %v", dra, tc.dra)
			}
			if tc.dp != nil && !slices.Equal(dp, tc.dp) {
				t.Errorf("the device plugin runs on %v, want %v", dp, tc.dp)
			}
		})
	}
}

// devicePluginProbes are, for every devicePlugin value that becomes a
// flag, values on both sides of what the schema or the plugin draws.
// TestSchemaAgreesWithDevicePluginFlags feeds each through the schema and
// through `gpudra device-plugin`'s own flag parsing.
var devicePluginProbes = map[string][]any{
	"devicePlugin.migStrategy":         {"", "none", "single", "mixed", "Mixed", "auto"},
	"devicePlugin.deviceListStrategy":  {[]any{}, []any{"cdi-cri"}, []any{"envvar", "cdi-annotations"}, []any{"volume-mounts"}, []any{"CDI-CRI"}},
	"devicePlugin.deviceIDStrategy":    {"", "uuid", "index", "UUID", "serial"},
	"devicePlugin.passDeviceSpecs":     {nil, true, false},
	"devicePlugin.cdiAnnotationPrefix": {"", "cdi.k8s.io/", "example.com/"},
	"devicePlugin.healthIgnoreXIDs":    {"", "13", "13,31,43", "0", "13,", "13 31", "x"},
	"devicePlugin.logVerbosity":        {0, 2, 10, -1},
	"devicePlugin.logFormat":           {"text", "json", "", "yaml"},
	"devicePlugin.devicePluginDir":     {"/var/lib/kubelet/device-plugins", "/", "", "device-plugins"},
}

// devicePluginNonFlagValues are the devicePlugin values that are not
// flags: whether and where the pod runs, and the config file's content.
var devicePluginNonFlagValues = []string{
	"devicePlugin.enabled", "devicePlugin.config", "devicePlugin.priorityClassName", "devicePlugin.nodeSelector",
	"devicePlugin.affinity", "devicePlugin.tolerations", "devicePlugin.podAnnotations", "devicePlugin.resources", "devicePlugin.env",
}

// devicePluginChartStricter are probes the schema refuses and the plugin
// takes, with the reason the chart cannot.
var devicePluginChartStricter = map[string]string{}

// TestSchemaAgreesWithDevicePluginFlags: values.schema.json accepts a
// devicePlugin value exactly when `gpudra device-plugin`'s flag parsing
// (pluginflags.CheckDevicePlugin) accepts the arguments the chart renders
// from it; otherwise an install the schema passed crash-loops, or a
// setting the plugin documents cannot be installed.
func TestSchemaAgreesWithDevicePluginFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "node-0")
	c := loadChart(t)
	unchecked := *c
	unchecked.Schema = nil
	for _, value := range slices.Sorted(maps.Keys(devicePluginProbes)) {
		for _, probe := range devicePluginProbes[value] {
			t.Run(fmt.Sprintf("%s=%v", value, probe), func(t *testing.T) {
				vals := values("devicePlugin.enabled", true, value, probe)
				_, schemaErr := RenderChart(c, Options{Values: vals})
				if schemaErr != nil && !strings.Contains(schemaErr.Error(), "schema") {
					t.Fatalf("the chart refuses %v outside its schema: %v", probe, schemaErr)
				}
				objs, err := RenderChart(&unchecked, Options{Values: vals})
				if err != nil {
					t.Fatalf("render without the schema: %v", err)
				}
				_, container := devicePluginContainer(t, objs)
				pluginErr := pluginflags.CheckDevicePlugin(container.Args[1:])
				switch {
				case schemaErr == nil && pluginErr != nil:
					t.Errorf("the schema accepts %s=%v, but the plugin refuses it at start: %v", value, probe, pluginErr)
				case schemaErr != nil && pluginErr == nil && devicePluginChartStricter[fmt.Sprintf("%s=%v", value, probe)] == "":
					t.Errorf("the plugin accepts %s=%v, but the schema refuses it:\n%v", value, probe, schemaErr)
				}
			})
		}
	}

	t.Run("every flag value is probed", func(t *testing.T) {
		var missing []string
		for _, leaf := range leaves("devicePlugin", c.Values["devicePlugin"].(map[string]any)) {
			if _, ok := devicePluginProbes[leaf]; !ok && !slices.Contains(devicePluginNonFlagValues, leaf) {
				missing = append(missing, leaf)
			}
		}
		if len(missing) > 0 {
			t.Errorf("values.yaml has devicePlugin values that reach a flag but have no probes: %v", missing)
		}
	})
}
