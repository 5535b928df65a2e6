package install

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/pluginflags"
)

// kubeletPluginProbes are, for every kubeletPlugin value that becomes a
// flag, values on both sides of each bound the schema or the plugin draws:
// the boundary itself, one past it, and the forms a user is likely to
// write. TestSchemaAgreesWithPluginFlags feeds each through the schema and
// through the plugin's own flag parsing.
var kubeletPluginProbes = map[string][]any{
	"driverName":                        {"gpu.nvidia.com", "gpu", "a.b-c.d", "", "GPU.nvidia.com", "gpu_nvidia.com", "nvidia.com/gpu", "-gpu.com", "gpu.com-", strings.Repeat("a", 63), strings.Repeat("a", 64)},
	"kubeletPlugin.driverRoot":          {"/", "/run/nvidia/driver", "", "run/nvidia/driver", "./driver"},
	"kubeletPlugin.containerDriverRoot": {"/", "/host-driver", "", "host-driver"},
	"kubeletPlugin.devRoot":             {"", "/", "/host-dev", "host-dev"},
	"kubeletPlugin.migMode":             {"dynamic", "static", "", "Dynamic", "auto"},
	"kubeletPlugin.migModeSwitching":    {true, false},
	"kubeletPlugin.deviceMetadata":      {true, false},
	"kubeletPlugin.sharing":             {"none", "memory-compute", "unlimited", "shares=1", "shares=2", "shares=10", "shares=99", "shares=100", "shares=101", "shares=500", "shares=0", "shares=01", "shares=-1", "shares=", "shares", "memory", "None", ""},
	"kubeletPlugin.sharingDefault":      {"whole", "share", "", "Whole", "shared"},
	"kubeletPlugin.vfio":                {"beside", "only", "off", "", "on"},
	"kubeletPlugin.vfioDriver":          {"vfio-pci", "nvgrace-gpu-vfio-pci", "", "nvidia"},
	"kubeletPlugin.vfioGPUs":            {[]any{}, []any{0}, []any{0, 7}, []any{255}, []any{-1}, []any{1, 1}},
	"kubeletPlugin.kubeAPIQPS":          {0.001, 1, 50, 1e6, 0, -1},
	"kubeletPlugin.kubeAPIBurst":        {1, 100, 1 << 20, 0, -1},
	"kubeletPlugin.logVerbosity":        {0, 1, 10, 11, 100, -1},
	"kubeletPlugin.logFormat":           {"text", "json", "", "yaml", "JSON"},
	"kubeletPlugin.httpPort":            {1, 8080, 65535, 0, 65536, -1},
	"kubeletPlugin.metricsPath":         {"/", "/metrics", "", "metrics"},
	"kubeletPlugin.discoveryInterval":   {"0s", "1ns", "1m", "1h30m", "1.5s", "-1s", "60", ""},
	"kubeletPlugin.sweepInterval":       {"0s", "30s", "1h", "-1m", "1d", ""},
	"kubeletPlugin.kubeletCallTimeout":  {"0s", "1s", "2m", "-2m", "2 m", ""},
	"kubeletPlugin.health.effect":       {"None", "NoSchedule", "NoExecute", "", "noschedule", "PreferNoSchedule"},
	"kubeletPlugin.health.lostEffect":   {"None", "NoSchedule", "NoExecute", "", "noexecute"},
	"kubeletPlugin.health.ignoreXIDs":   {"", "13", "13,31,43", "0", "13,", ",13", "13 31", "x"},
	"kubeletPlugin.mps.root":            {"/", "/run/gpudra/mps", "", "run/mps"},
	"kubeletPlugin.mps.launcher":        {"process", "systemd-run", "", "systemd"},
	"kubeletPlugin.mps.nsenterPath":     {"/usr/bin/nsenter", "", "nsenter"},
	"kubeletPlugin.mps.systemdRunPath":  {"/usr/bin/systemd-run", "", "systemd-run"},
	"kubeletPlugin.mps.controlBinary":   {"", "/opt/mps-control", "mps-control"},
	"kubeletPlugin.nvidiaSMIPath":       {"", "/usr/bin/nvidia-smi", "nvidia-smi"},
	"kubeletPlugin.nvidiaCDIHookPath":   {"/usr/bin/nvidia-cdi-hook", "", "nvidia-cdi-hook"},
	"kubeletPlugin.cdiDir":              {"/var/run/cdi", "", "cdi"},
	"kubeletPlugin.kubeletPluginsDir":   {"/var/lib/kubelet/plugins", "/", "", "plugins"},
	"kubeletPlugin.kubeletRegistrarDir": {"/var/lib/kubelet/plugins_registry", "", "plugins_registry"},
	"kubeletPlugin.sysfsRoot":           {"/sys", "/", "", "sys"},
	"kubeletPlugin.procRoot":            {"/proc", "", "proc"},
}

// chartStricter are the probes the schema refuses and the plugin takes, each
// with the reason the chart cannot: a value that is a mount path of the
// chart's pod, or that only makes sense for a plugin outside a container.
var chartStricter = map[string]string{
	"kubeletPlugin.containerDriverRoot=": "the chart mounts the host's driver root there",
	"kubeletPlugin.kubeletPluginsDir=":   "the chart mounts the kubelet's plugin directory there",
	"kubeletPlugin.mps.nsenterPath=":     "empty means a plugin running on the host, and the chart's runs in a container",
}

// TestSchemaAgreesWithPluginFlags: values.schema.json accepts a value of a
// kubelet plugin flag exactly when the plugin's own flag parsing
// (pluginflags.CheckKubeletPlugin, what `gpudra kubelet-plugin` runs
// before it touches the node) accepts the argument the chart renders from
// it. A value the schema passes but the plugin refuses makes every plugin
// pod exit at start; a value the schema refuses but the plugin takes is a
// documented setting the chart cannot install. Either way the two drifted.
func TestSchemaAgreesWithPluginFlags(t *testing.T) {
	t.Setenv("NODE_NAME", "node-0") // the DaemonSet sets it from the pod's node
	c := loadChart(t)
	unchecked := *c
	unchecked.Schema = nil
	for _, value := range slices.Sorted(maps.Keys(kubeletPluginProbes)) {
		for _, probe := range kubeletPluginProbes[value] {
			t.Run(fmt.Sprintf("%s=%v", value, probe), func(t *testing.T) {
				vals := values(value, probe)
				if value == "kubeletPlugin.vfio" && probe == "only" {
					vals = values(value, probe, "kubeletPlugin.vfioGPUs", []any{0})
				}
				_, schemaErr := RenderChart(c, Options{Values: vals})
				if schemaErr != nil && !strings.Contains(schemaErr.Error(), "schema") {
					t.Fatalf("the chart refuses %v outside its schema; probe a value the templates render: %v", probe, schemaErr)
				}
				objs, err := RenderChart(&unchecked, Options{Values: vals})
				if err != nil {
					t.Fatalf("render without the schema: %v", err)
				}
				_, container := pluginContainer(t, objs)
				if len(container.Args) == 0 || container.Args[0] != "kubelet-plugin" {
					t.Fatalf("plugin args %q do not start with kubelet-plugin", container.Args)
				}
				pluginErr := pluginflags.CheckKubeletPlugin(container.Args[1:])
				switch {
				case schemaErr == nil && pluginErr != nil:
					t.Errorf("the schema accepts %s=%v, but the plugin refuses it at start: %v", value, probe, pluginErr)
				case schemaErr != nil && pluginErr == nil && chartStricter[fmt.Sprintf("%s=%v", value, probe)] == "":
					t.Errorf("the plugin accepts %s=%v, but the schema refuses it:\n%v", value, probe, schemaErr)
				}
			})
		}
	}

	t.Run("every flag value is probed", func(t *testing.T) {
		var missing []string
		for _, leaf := range append(leaves("kubeletPlugin", c.Values["kubeletPlugin"].(map[string]any)), "driverName") {
			if _, ok := kubeletPluginProbes[leaf]; !ok && !slices.Contains(kubeletPluginNonFlagValues, leaf) {
				missing = append(missing, leaf)
			}
		}
		if len(missing) > 0 {
			t.Errorf("values.yaml has kubeletPlugin values that reach a flag but have no probes: %v", missing)
		}
	})
}
