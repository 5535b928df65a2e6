package install

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestComputeDomainValuesReachFlags changes each computeDomains value that
// names a flag and checks that the flag's argument changes with it, in the
// container the value is for; the last case makes sure the table names
// every such value in values.yaml.
func TestComputeDomainValuesReachFlags(t *testing.T) {
	const plugin, controller = "compute-domains", "controller"
	cases := []struct {
		value     string
		to        any
		container string
		flag      string
		want      string
	}{
		{"computeDomains.driverName", "cd.example.com", plugin, "driver-name", "cd.example.com"},
		{"computeDomains.maxChannels", 128, plugin, "max-channels", "128"},
		{"computeDomains.maxChannels", 128, controller, "max-channels", "128"},
		{"computeDomains.kubeletPlugin.sharedChannel", false, plugin, "shared-channel", "false"},
		{"kubeletPlugin.deviceMetadata", false, plugin, "device-metadata", "false"},
		{"computeDomains.kubeletPlugin.httpPort", 9091, plugin, "http-endpoint", ":9091"},
		{"computeDomains.kubeletPlugin.metricsPath", "/m", plugin, "metrics-path", "/m"},
		{"computeDomains.kubeletPlugin.discoveryInterval", "5m", plugin, "discovery-interval", "5m"},
		{"computeDomains.kubeletPlugin.sweepInterval", "30s", plugin, "sweep-interval", "30s"},
		{"computeDomains.kubeletPlugin.kubeletCallTimeout", "2m", plugin, "kubelet-call-timeout", "2m"},
		{"computeDomains.kubeletPlugin.kubeAPIQPS", 7.5, plugin, "kube-api-qps", "7.5"},
		{"computeDomains.kubeletPlugin.kubeAPIBurst", 9, plugin, "kube-api-burst", "9"},
		{"computeDomains.kubeletPlugin.logVerbosity", 6, plugin, "v", "6"},
		{"computeDomains.kubeletPlugin.logFormat", "json", plugin, "logging-format", "json"},
		{"computeDomains.kubeletPlugin.imex.daemon", "required", plugin, "imex-daemon", "required"},
		{"computeDomains.kubeletPlugin.imex.binary", "/opt/imex/nvidia-imex", plugin, "imex-binary", "/opt/imex/nvidia-imex"},
		{"computeDomains.kubeletPlugin.imex.ctl", "/opt/imex/nvidia-imex-ctl", plugin, "imex-ctl", "/opt/imex/nvidia-imex-ctl"},
		{"computeDomains.kubeletPlugin.imex.launcher", "systemd-run", plugin, "imex-launcher", "systemd-run"},
		{"computeDomains.kubeletPlugin.imex.nsenterPath", "/usr/bin/nsenter", plugin, "imex-nsenter-path", "/usr/bin/nsenter"},
		{"computeDomains.kubeletPlugin.imex.systemdRunPath", "/bin/systemd-run", plugin, "imex-systemd-run-path", "/bin/systemd-run"},
		{"computeDomains.kubeletPlugin.imex.dir", "/var/run/imex", plugin, "imex-dir", "/var/run/imex"},
		{"computeDomains.kubeletPlugin.imex.hostsFile", "/run/imex-hosts", plugin, "imex-hosts-file", "/run/imex-hosts"},
		{"computeDomains.kubeletPlugin.imex.port", 51000, plugin, "imex-port", "51000"},
		{"computeDomains.kubeletPlugin.imex.cmdPort", 51005, plugin, "imex-cmd-port", "51005"},
		{"computeDomains.kubeletPlugin.imex.maxNodes", 72, plugin, "imex-max-nodes", "72"},
		{"computeDomains.kubeletPlugin.imex.idleStop", "2m", plugin, "imex-idle-stop", "2m"},
		{"computeDomains.driverName", "cd.example.com", controller, "channel-driver-name", "cd.example.com"},
		{"computeDomains.controller.leaderElection.enabled", false, controller, "leader-elect", "false"},
		{"computeDomains.controller.leaderElection.leaseDuration", "30s", controller, "leader-election-lease-duration", "30s"},
		{"computeDomains.controller.leaderElection.renewDeadline", "20s", controller, "leader-election-renew-deadline", "20s"},
		{"computeDomains.controller.leaderElection.retryPeriod", "4s", controller, "leader-election-retry-period", "4s"},
		{"computeDomains.controller.resyncInterval", "1h", controller, "resync-interval", "1h"},
		{"computeDomains.controller.kubeAPIQPS", 7.5, controller, "kube-api-qps", "7.5"},
		{"computeDomains.controller.kubeAPIBurst", 9, controller, "kube-api-burst", "9"},
		{"computeDomains.controller.logVerbosity", 6, controller, "v", "6"},
		{"computeDomains.controller.logFormat", "json", controller, "logging-format", "json"},
		// The host paths the two plugin containers share are kubeletPlugin's.
		{"kubeletPlugin.driverRoot", "/run/nvidia/driver", plugin, "driver-root", "/run/nvidia/driver"},
		{"kubeletPlugin.containerDriverRoot", "/host-driver", plugin, "container-driver-root", "/host-driver"},
		{"kubeletPlugin.procRoot", "/hp", plugin, "proc-root", "/hp"},
		{"kubeletPlugin.cdiDir", "/etc/cdi", plugin, "cdi-dir", "/etc/cdi"},
		{"kubeletPlugin.kubeletPluginsDir", "/data/kubelet/plugins", plugin, "plugin-data-dir", "/data/kubelet/plugins/compute-domain.nvidia.com"},
		{"kubeletPlugin.kubeletRegistrarDir", "/data/kubelet/plugins_registry", plugin, "registrar-dir", "/data/kubelet/plugins_registry"},
	}
	for _, tc := range cases {
		t.Run(tc.value+"/"+tc.container, func(t *testing.T) {
			objs := render(t, Options{Values: values(tc.value, tc.to)})
			var c corev1.Container
			if tc.container == plugin {
				c = cdContainer(t, objs)
			} else {
				_, c = controllerContainer(t, objs)
			}
			if got, ok := flagValue(c.Args, tc.flag); !ok || got != tc.want {
				t.Errorf("%s=%v: %s --%s=%q (set: %v), want %q", tc.value, tc.to, tc.container, tc.flag, got, ok, tc.want)
			}
		})
	}

	t.Run("every flag value is covered", func(t *testing.T) {
		// Values that are not flags: whether the driver is there, and
		// where and how the controller's pods run.
		notFlags := []string{
			"computeDomains.enabled", "computeDomains.controller.replicas",
			"computeDomains.controller.priorityClassName", "computeDomains.controller.nodeSelector",
			"computeDomains.controller.affinity", "computeDomains.controller.tolerations",
			"computeDomains.controller.podAnnotations", "computeDomains.controller.resources",
			"computeDomains.kubeletPlugin.resources",
		}
		var covered []string
		for _, tc := range cases {
			covered = append(covered, tc.value)
		}
		var missing []string
		for _, leaf := range leaves("computeDomains", loadChart(t).Values["computeDomains"].(map[string]any)) {
			if !slices.Contains(covered, leaf) && !slices.Contains(notFlags, leaf) {
				missing = append(missing, leaf)
			}
		}
		if len(missing) > 0 {
			t.Errorf("values.yaml has computeDomains values this test does not map to a flag: %v", missing)
		}
	})
}

// TestComputeDomainFlagsExist checks every flag the compute-domains
// container and the controller Deployment pass against the flags of the
// binary built from this tree, with and without leader election.
func TestComputeDomainFlagsExist(t *testing.T) {
	for _, vals := range []map[string]any{nil, values("computeDomains.controller.leaderElection.enabled", false)} {
		objs := render(t, Options{Values: vals})
		_, ctrl := controllerContainer(t, objs)
		for _, container := range []struct {
			name    string
			c       corev1.Container
			command string
			sub     string
		}{
			{"compute-domains", cdContainer(t, objs), "/usr/bin/gpudra-node", "compute-domain-kubelet-plugin"},
			{"controller", ctrl, "/usr/bin/gpudra", "compute-domain-controller"},
		} {
			if !slices.Equal(container.c.Command, []string{container.command}) {
				t.Errorf("%s: command %q, want %s", container.name, container.c.Command, container.command)
			}
			known := subcommandFlags(t, container.command, container.sub)
			if len(known) < 10 {
				t.Fatalf("gpudra %s --help lists %d flags: %v", container.sub, len(known), known)
			}
			for _, name := range argFlags(t, container.c.Args, container.sub) {
				if !slices.Contains(known, name) {
					t.Errorf("the %s container passes --%s, which gpudra %s does not have", container.name, name, container.sub)
				}
			}
		}
	}
}
