package install

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestSimulationValues checks the values the local cluster's real nodes
// install the chart with (docs/development/real-node.md): simulation.fleet and
// stateDir reach the plugin's and the init container's command lines,
// the state directory is mounted at its own path, /sys is left out, and
// hostNetwork and env reach the pod; a fleet file is the host's, mounted
// read-only at its own path into both containers; the defaults leave all
// of it out.
func TestSimulationValues(t *testing.T) {
	env := []any{map[string]any{"name": "KUBERNETES_SERVICE_HOST", "value": "127.0.0.1"}}
	for _, tc := range []struct {
		name        string
		values      map[string]any
		fleet       string
		fleetFile   bool
		stateDir    string
		sysfs       bool
		hostNetwork bool
		env         bool
	}{
		{name: "defaults", values: nil, sysfs: true},
		{name: "fleet", values: values("simulation.fleet", "dgx-h100"), fleet: "dgx-h100"},
		{name: "fleet file", values: values("simulation.fleet", "/n/fleet.yaml"), fleet: "/n/fleet.yaml", fleetFile: true},
		{name: "fleet and state", values: values("simulation.fleet", "dgx-h100", "simulation.stateDir", "/n/0/sim"), fleet: "dgx-h100", stateDir: "/n/0/sim"},
		{name: "host network and env", values: values("kubeletPlugin.hostNetwork", true, "kubeletPlugin.env", env), sysfs: true, hostNetwork: true, env: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ds, c := pluginContainer(t, render(t, Options{Values: tc.values}))
			spec := ds.Spec.Template.Spec
			if len(spec.InitContainers) != 1 {
				t.Fatalf("%d init containers, want the driver root check", len(spec.InitContainers))
			}
			for _, args := range [][]string{c.Args, spec.InitContainers[0].Args} {
				if got, _ := flagValue(args, "fleet"); got != tc.fleet {
					t.Errorf("--fleet=%q in %v, want %q", got, args[0], tc.fleet)
				}
			}
			if got, _ := flagValue(c.Args, "sim-state-dir"); got != tc.stateDir {
				t.Errorf("--sim-state-dir=%q, want %q", got, tc.stateDir)
			}
			hasVolume := func(name string) bool {
				return slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == name })
			}
			hasMount := func(name, path string) bool {
				return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == name && (path == "" || m.MountPath == path) })
			}
			fileVolume := slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool {
				return v.Name == "sim-fleet" && v.HostPath != nil && v.HostPath.Path == tc.fleet && v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathFile
			})
			if fileVolume != tc.fleetFile {
				t.Errorf("the host's fleet file %q as a volume: %v, want %v", tc.fleet, fileVolume, tc.fleetFile)
			}
			for _, container := range []corev1.Container{c, spec.InitContainers[0]} {
				mounted := slices.ContainsFunc(container.VolumeMounts, func(m corev1.VolumeMount) bool {
					return m.Name == "sim-fleet" && m.MountPath == tc.fleet && m.ReadOnly
				})
				if mounted != tc.fleetFile {
					t.Errorf("container %s: fleet file mounted read-only at %q: %v, want %v", container.Name, tc.fleet, mounted, tc.fleetFile)
				}
			}
			if hasVolume("sysfs") != tc.sysfs || hasMount("sysfs", "") != tc.sysfs {
				t.Errorf("sysfs volume %v, mount %v, want %v", hasVolume("sysfs"), hasMount("sysfs", ""), tc.sysfs)
			}
			if want := tc.stateDir != ""; hasVolume("sim-state") != want || (want && !hasMount("sim-state", tc.stateDir)) {
				t.Errorf("sim-state volume %v, mounted at %s: %v, want %v", hasVolume("sim-state"), tc.stateDir, hasMount("sim-state", tc.stateDir), want)
			}
			if spec.HostNetwork != tc.hostNetwork {
				t.Errorf("hostNetwork %v, want %v", spec.HostNetwork, tc.hostNetwork)
			}
			hasEnv := slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "KUBERNETES_SERVICE_HOST" && e.Value == "127.0.0.1" })
			if hasEnv != tc.env {
				t.Errorf("KUBERNETES_SERVICE_HOST in the plugin's env: %v, want %v", hasEnv, tc.env)
			}
		})
	}
}
