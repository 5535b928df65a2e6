package install

import (
	"strings"
	"testing"
)

// TestSchemaRefuses checks that values.schema.json refuses mistyped values
// at install, as helm install validates them, with a message that names the
// value.
func TestSchemaRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   string
	}{
		{"verbosity as a word", values("kubeletPlugin.logVerbosity", "high"), "/kubeletPlugin/logVerbosity"},
		{"verbosity negative", values("kubeletPlugin.logVerbosity", -1), "/kubeletPlugin/logVerbosity"},
		{"QPS as a string", values("kubeletPlugin.kubeAPIQPS", "fast"), "/kubeletPlugin/kubeAPIQPS"},
		{"unknown MIG mode", values("kubeletPlugin.migMode", "auto"), "/kubeletPlugin/migMode"},
		{"more shares than the plugin takes", values("kubeletPlugin.sharing", "shares=101"), "/kubeletPlugin/sharing"},
		{"NVIDIA's sharing spelling", values("kubeletPlugin.sharing", "memory"), "/kubeletPlugin/sharing"},
		{"VFIO as a bool", values("kubeletPlugin.vfio", true), "/kubeletPlugin/vfio"},
		{"GPU minors as a string", values("kubeletPlugin.vfioGPUs", "0,1"), "/kubeletPlugin/vfioGPUs"},
		{"relative driver root", values("kubeletPlugin.driverRoot", "run/nvidia/driver"), "/kubeletPlugin/driverRoot"},
		{"duration without unit", values("kubeletPlugin.sweepInterval", "60"), "/kubeletPlugin/sweepInterval"},
		{"port out of range", values("kubeletPlugin.httpPort", 70000), "/kubeletPlugin/httpPort"},
		{"taint effect lowercase", values("kubeletPlugin.health.effect", "noschedule"), "/kubeletPlugin/health/effect"},
		{"misspelt value", values("kubeletPlugin.migmode", "static"), "migmode"},
		{"misspelt section", values("kubeletplugin.migMode", "static"), "kubeletplugin"},
		{"log format", values("webhook.logFormat", "yaml"), "/webhook/logFormat"},
		{"failure policy lowercase", values("webhook.failurePolicy", "fail"), "/webhook/failurePolicy"},
		{"TLS mode", values("webhook.tls.mode", "cert-manager"), "/webhook/tls/mode"},
		{"extendedResourceName as a name", values("deviceClasses.extendedResourceName", "nvidia.com/gpu"), "/deviceClasses/extendedResourceName"},
		{"driver name with a slash", values("driverName", "nvidia.com/gpu"), "/driverName"},
		{"namespace with capitals", values("namespace.name", "GPU"), "/namespace/name"},
		{"ComputeDomains as a word", values("computeDomains.enabled", "yes"), "/computeDomains/enabled"},
		{"channel driver with a slash", values("computeDomains.driverName", "nvidia.com/cd"), "/computeDomains/driverName"},
		{"no channels", values("computeDomains.maxChannels", 0), "/computeDomains/maxChannels"},
		{"channels as a string", values("computeDomains.maxChannels", "2048"), "/computeDomains/maxChannels"},
		{"controller replicas as a string", values("computeDomains.controller.replicas", "2"), "/computeDomains/controller/replicas"},
		{"leader election as a string", values("computeDomains.controller.leaderElection.enabled", "true"), "/computeDomains/controller/leaderElection/enabled"},
		{"lease duration without unit", values("computeDomains.controller.leaderElection.leaseDuration", "15"), "/computeDomains/controller/leaderElection/leaseDuration"},
		{"controller QPS as a string", values("computeDomains.controller.kubeAPIQPS", "fast"), "/computeDomains/controller/kubeAPIQPS"},
		{"controller log format", values("computeDomains.controller.logFormat", "yaml"), "/computeDomains/controller/logFormat"},
		{"shared channel as a string", values("computeDomains.kubeletPlugin.sharedChannel", "true"), "/computeDomains/kubeletPlugin/sharedChannel"},
		{"channel plugin port out of range", values("computeDomains.kubeletPlugin.httpPort", 0), "/computeDomains/kubeletPlugin/httpPort"},
		{"channel plugin verbosity as a word", values("computeDomains.kubeletPlugin.logVerbosity", "high"), "/computeDomains/kubeletPlugin/logVerbosity"},
		{"misspelt ComputeDomain value", values("computeDomains.controller.replica", 1), "replica"},
		{"IMEX daemon as a bool", values("computeDomains.kubeletPlugin.imex.daemon", true), "/computeDomains/kubeletPlugin/imex/daemon"},
		{"unknown IMEX daemon mode", values("computeDomains.kubeletPlugin.imex.daemon", "on"), "/computeDomains/kubeletPlugin/imex/daemon"},
		{"unknown IMEX launcher", values("computeDomains.kubeletPlugin.imex.launcher", "systemd"), "/computeDomains/kubeletPlugin/imex/launcher"},
		{"empty IMEX binary", values("computeDomains.kubeletPlugin.imex.binary", ""), "/computeDomains/kubeletPlugin/imex/binary"},
		{"relative IMEX hosts file", values("computeDomains.kubeletPlugin.imex.hostsFile", "etc/hosts"), "/computeDomains/kubeletPlugin/imex/hostsFile"},
		{"relative IMEX dir", values("computeDomains.kubeletPlugin.imex.dir", "imex"), "/computeDomains/kubeletPlugin/imex/dir"},
		{"IMEX port out of range", values("computeDomains.kubeletPlugin.imex.port", 65536), "/computeDomains/kubeletPlugin/imex/port"},
		{"IMEX cmd port as a string", values("computeDomains.kubeletPlugin.imex.cmdPort", "50005"), "/computeDomains/kubeletPlugin/imex/cmdPort"},
		{"IMEX max nodes over the limit", values("computeDomains.kubeletPlugin.imex.maxNodes", 257), "/computeDomains/kubeletPlugin/imex/maxNodes"},
		{"IMEX idle stop without unit", values("computeDomains.kubeletPlugin.imex.idleStop", "30"), "/computeDomains/kubeletPlugin/imex/idleStop"},
		{"misspelt IMEX value", values("computeDomains.kubeletPlugin.imex.hostFile", "/etc/hosts"), "hostFile"},
		{"relative simulation state directory", values("simulation.fleet", "dgx-h100", "simulation.stateDir", "state"), "stateDir"},
		{"misspelt simulation value", values("simulation.fleets", "dgx-h100"), "fleets"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := RenderChart(loadChart(t), Options{Values: tc.values})
			if err == nil {
				t.Fatalf("values %v were accepted", tc.values)
			}
			if !strings.Contains(err.Error(), "schema") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error does not name %s as a schema violation:\n%v", tc.want, err)
			}
		})
	}
}

// TestTemplateRefusals checks the refusals the schema cannot word well.
func TestTemplateRefusals(t *testing.T) {
	for _, tc := range []struct {
		name      string
		namespace string
		values    map[string]any
		want      string
	}{
		{"controller replicas without a leader", "", values("computeDomains.controller.replicas", 2, "computeDomains.controller.leaderElection.enabled", false), "computeDomains.controller.leaderElection.enabled"},
		{"one name for both drivers", "", values("computeDomains.driverName", "gpu.nvidia.com"), "computeDomains.driverName"},
		{"one port for both containers", "", values("computeDomains.kubeletPlugin.httpPort", 8080), "computeDomains.kubeletPlugin.httpPort"},
		{"create the release's namespace", "gpudra", values("namespace.create", true), "--create-namespace"},
		{"create it by name", "gpudra", values("namespace.create", true, "namespace.name", "gpudra"), "--create-namespace"},
		{"Secret without a name", "", values("webhook.tls.mode", "secret"), "webhook.tls.secretName"},
		{"self-signed webhook replicas", "", values("webhook.replicas", 2), "webhook.tls.mode=secret"},
		{"VFIO only without GPUs", "", values("kubeletPlugin.vfio", "only"), "kubeletPlugin.vfioGPUs"},
		{"simulated state without a fleet", "", values("simulation.stateDir", "/var/lib/gpudra-sim"), "simulation.fleet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := RenderChart(loadChart(t), Options{Namespace: tc.namespace, Values: tc.values})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// TestKubeVersion checks the chart's kubeVersion: resource.k8s.io/v1 and
// the token's node name are in 1.34.
func TestKubeVersion(t *testing.T) {
	for version, ok := range map[string]bool{"v1.33.5": false, "v1.34.0": true, "v1.37.1": true, "v1.38.0-alpha.1": true} {
		_, err := RenderChart(loadChart(t), Options{KubeVersion: version})
		if (err == nil) != ok {
			t.Errorf("Kubernetes %s: error %v, want accepted=%v", version, err, ok)
		}
	}
}
