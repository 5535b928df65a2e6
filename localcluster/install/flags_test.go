package install

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
)

// TestKubeletPluginValuesReachFlags changes each kubeletPlugin value that
// names a flag and checks that the flag's argument changes with it: no
// value does nothing. The last case makes sure the table names every such
// value in values.yaml.
func TestKubeletPluginValuesReachFlags(t *testing.T) {
	cases := []struct {
		value string
		to    any
		flag  string
		want  string
	}{
		{"kubeletPlugin.driverRoot", "/run/nvidia/driver", "driver-root", "/run/nvidia/driver"},
		{"kubeletPlugin.containerDriverRoot", "/host-driver", "container-driver-root", "/host-driver"},
		{"kubeletPlugin.devRoot", "/host-dev", "dev-root", "/host-dev"},
		{"kubeletPlugin.migMode", "static", "mig-mode", "static"},
		{"kubeletPlugin.migModeSwitching", true, "mig-mode-switching", "true"},
		{"kubeletPlugin.deviceMetadata", false, "device-metadata", "false"},
		{"kubeletPlugin.sharing", "memory-compute", "sharing", "memory-compute"},
		{"kubeletPlugin.sharingDefault", "share", "sharing-default", "share"},
		{"kubeletPlugin.vfio", "off", "vfio", "off"},
		{"kubeletPlugin.vfioDriver", "nvgrace-gpu-vfio-pci", "vfio-driver", "nvgrace-gpu-vfio-pci"},
		{"kubeletPlugin.vfioGPUs", []any{1, 2}, "vfio-gpus", "1,2"},
		{"kubeletPlugin.kubeAPIQPS", 7.5, "kube-api-qps", "7.5"},
		{"kubeletPlugin.kubeAPIBurst", 9, "kube-api-burst", "9"},
		{"kubeletPlugin.logVerbosity", 6, "v", "6"},
		{"kubeletPlugin.logFormat", "json", "logging-format", "json"},
		{"kubeletPlugin.httpPort", 9090, "http-endpoint", ":9090"},
		{"kubeletPlugin.metricsPath", "/m", "metrics-path", "/m"},
		{"kubeletPlugin.discoveryInterval", "5m", "discovery-interval", "5m"},
		{"kubeletPlugin.sweepInterval", "30s", "sweep-interval", "30s"},
		{"kubeletPlugin.kubeletCallTimeout", "2m", "kubelet-call-timeout", "2m"},
		{"kubeletPlugin.health.effect", "NoExecute", "health-effect", "NoExecute"},
		{"kubeletPlugin.health.lostEffect", "None", "health-lost-effect", "None"},
		{"kubeletPlugin.health.ignoreXIDs", "13", "health-ignore-xids", "13"},
		{"kubeletPlugin.mps.root", "/run/mps", "mps-root", "/run/mps"},
		{"kubeletPlugin.mps.launcher", "process", "mps-launcher", "process"},
		{"kubeletPlugin.mps.nsenterPath", "/bin/nsenter", "nsenter-path", "/bin/nsenter"},
		{"kubeletPlugin.mps.systemdRunPath", "/bin/systemd-run", "systemd-run-path", "/bin/systemd-run"},
		{"kubeletPlugin.mps.controlBinary", "/opt/mps-control", "mps-control-binary", "/opt/mps-control"},
		{"kubeletPlugin.nvidiaSMIPath", "/opt/nvidia-smi", "nvidia-smi-path", "/opt/nvidia-smi"},
		{"kubeletPlugin.nvidiaCDIHookPath", "/opt/nvidia-cdi-hook", "nvidia-cdi-hook-path", "/opt/nvidia-cdi-hook"},
		{"kubeletPlugin.cdiDir", "/etc/cdi", "cdi-dir", "/etc/cdi"},
		{"kubeletPlugin.kubeletPluginsDir", "/data/kubelet/plugins", "plugin-data-dir", "/data/kubelet/plugins/gpu.nvidia.com"},
		{"kubeletPlugin.kubeletRegistrarDir", "/data/kubelet/plugins_registry", "registrar-dir", "/data/kubelet/plugins_registry"},
		{"kubeletPlugin.sysfsRoot", "/hs", "sysfs-root", "/hs"},
		{"kubeletPlugin.procRoot", "/hp", "proc-root", "/hp"},
		{"driverName", "gpu.example.com", "driver-name", "gpu.example.com"},
	}
	for _, tc := range cases {
		t.Run(tc.value, func(t *testing.T) {
			_, c := pluginContainer(t, render(t, Options{Values: values(tc.value, tc.to)}))
			if got, ok := flagValue(c.Args, tc.flag); !ok || got != tc.want {
				t.Errorf("%s=%v: --%s=%q (set: %v), want %q", tc.value, tc.to, tc.flag, got, ok, tc.want)
			}
		})
	}

	t.Run("every flag value is covered", func(t *testing.T) {
		notFlags := kubeletPluginNonFlagValues
		var covered []string
		for _, tc := range cases {
			covered = append(covered, tc.value)
		}
		var missing []string
		for _, leaf := range leaves("kubeletPlugin", loadChart(t).Values["kubeletPlugin"].(map[string]any)) {
			if !slices.Contains(covered, leaf) && !slices.Contains(notFlags, leaf) {
				missing = append(missing, leaf)
			}
		}
		if len(missing) > 0 {
			t.Errorf("values.yaml has kubeletPlugin values this test does not map to a flag: %v", missing)
		}
	})
}

// kubeletPluginNonFlagValues are the values of the kubelet plugin that are
// not flags: where and how the pod runs.
var kubeletPluginNonFlagValues = []string{
	"kubeletPlugin.checkDriverRoot.enabled", "kubeletPlugin.probes.enabled",
	"kubeletPlugin.priorityClassName", "kubeletPlugin.nodeSelector", "kubeletPlugin.affinity", "kubeletPlugin.tolerations",
	"kubeletPlugin.podAnnotations", "kubeletPlugin.resources", "kubeletPlugin.hostNetwork", "kubeletPlugin.env",
}

// leaves lists the dotted paths of m's non-map values; a map that is
// empty in values.yaml (nodeSelector: {}) is a leaf.
func leaves(prefix string, m map[string]any) []string {
	var out []string
	for k, v := range m {
		path := prefix + "." + k
		if sub, ok := v.(map[string]any); ok && len(sub) > 0 && k != "affinity" {
			out = append(out, leaves(path, sub)...)
		} else {
			out = append(out, path)
		}
	}
	sort.Strings(out)
	return out
}

var (
	gpudraOnce sync.Once
	gpudraBin  string
	gpudraErr  error
)

// gpudraBinary builds cmd/gpudra and cmd/gpudra-node into one directory
// once per test run and returns the one the image has at command, by its
// name (/usr/bin/gpudra or /usr/bin/gpudra-node).
func gpudraBinary(t *testing.T, command string) string {
	t.Helper()
	gpudraOnce.Do(func() {
		dir, err := os.MkdirTemp("", "install-gpudra-")
		if err != nil {
			gpudraErr = err
			return
		}
		gpudraBin = dir
		cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/gpudra", "./cmd/gpudra-node")
		cmd.Dir = filepath.Join(ChartDir(), "..", "..", "..")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			gpudraErr = err
			gpudraBin = string(out)
		}
	})
	if gpudraErr != nil {
		t.Fatalf("build cmd/gpudra and cmd/gpudra-node: %v\n%s", gpudraErr, gpudraBin)
	}
	return filepath.Join(gpudraBin, path.Base(command))
}

var helpFlag = regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`)

// subcommandFlags returns the flags `<command> <sub> --help` lists, or nil
// when there is no such subcommand; command is the image's
// /usr/bin/gpudra or /usr/bin/gpudra-node.
func subcommandFlags(t *testing.T, command, sub string) []string {
	t.Helper()
	out, err := exec.Command(gpudraBinary(t, command), sub, "--help").CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "unknown command") {
			return nil
		}
		t.Fatalf("%s %s --help: %v\n%s", command, sub, err, out)
	}
	if !strings.Contains(string(out), path.Base(command)+" "+sub) {
		// cobra answers an unknown subcommand of a command with args with
		// the root's help.
		return nil
	}
	var flags []string
	for _, m := range helpFlag.FindAllStringSubmatch(string(out), -1) {
		flags = append(flags, m[1])
	}
	return flags
}

// argFlags returns the flag names in args (--name=value), after the
// subcommand.
func argFlags(t *testing.T, args []string, sub string) []string {
	t.Helper()
	if len(args) == 0 || args[0] != sub {
		t.Fatalf("args %q do not start with %s", args, sub)
	}
	var names []string
	for _, a := range args[1:] {
		name, _, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok || !strings.HasPrefix(a, "--") {
			t.Errorf("argument %q is not --flag=value", a)
			continue
		}
		names = append(names, name)
	}
	return names
}

// TestKubeletPluginFlagsExist checks every flag the DaemonSet passes
// against the flags of the binary built from this tree, in a render with
// every optional flag set.
func TestKubeletPluginFlagsExist(t *testing.T) {
	objs := render(t, Options{Values: values(
		"kubeletPlugin.devRoot", "/d", "kubeletPlugin.vfioGPUs", []any{0},
		"kubeletPlugin.mps.controlBinary", "/c", "kubeletPlugin.nvidiaSMIPath", "/s",
	)})
	ds, c := pluginContainer(t, objs)
	init := ds.Spec.Template.Spec.InitContainers
	if len(init) != 1 {
		t.Fatalf("init containers %v, want one", init)
	}
	// The node's containers run /usr/bin/gpudra-node, the image's node
	// subcommands alone (deployments/container).
	for _, container := range []struct {
		name    string
		command []string
		sub     string
		args    []string
	}{
		{"plugin", c.Command, "kubelet-plugin", c.Args},
		{"check-driver-root", init[0].Command, "inspect", init[0].Args},
	} {
		if !slices.Equal(container.command, []string{"/usr/bin/gpudra-node"}) {
			t.Errorf("%s: command %q, want /usr/bin/gpudra-node", container.name, container.command)
		}
		known := subcommandFlags(t, container.command[0], container.sub)
		if len(known) < 10 {
			t.Fatalf("gpudra %s --help lists %d flags: %v", container.sub, len(known), known)
		}
		for _, name := range argFlags(t, container.args, container.sub) {
			if !slices.Contains(known, name) {
				t.Errorf("the DaemonSet's %s container passes --%s, which gpudra %s does not have", container.name, name, container.sub)
			}
		}
	}
	// The init container checks the root the plugin will use.
	for _, flag := range []string{"driver-root", "container-driver-root", "sysfs-root", "proc-root", "driver-name"} {
		want, _ := flagValue(c.Args, flag)
		if got, _ := flagValue(init[0].Args, flag); got != want {
			t.Errorf("check-driver-root --%s=%q, the plugin's is %q", flag, got, want)
		}
	}
}

// TestWebhookFlagsExist does the same for the webhook Deployment, in both
// TLS modes, once this tree's gpudra has a webhook command.
func TestWebhookFlagsExist(t *testing.T) {
	known := subcommandFlags(t, "/usr/bin/gpudra", "webhook")
	if known == nil {
		t.Skip("this tree's gpudra has no webhook command yet; its flags are assumed in the chart's gpudra.webhook.args")
	}
	for _, vals := range []map[string]any{
		nil,
		values("webhook.tls.mode", "secret", "webhook.tls.secretName", "s", "webhook.tls.caBundle", "Y2E="),
	} {
		dep := find[*appsv1.Deployment](t, render(t, Options{Values: vals}), "gpudra-webhook")
		c := dep.Spec.Template.Spec.Containers[0]
		for _, name := range argFlags(t, c.Args, "webhook") {
			if !slices.Contains(known, name) {
				t.Errorf("the webhook Deployment passes --%s, which gpudra webhook does not have", name)
			}
		}
	}
}
