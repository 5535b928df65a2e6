package cluster

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpudra/gpudra/pkg/simfleet"

	"github.com/gpudra/gpudra/localcluster/realnode/node"
)

// TestRealNodeSimulatesTheFleetFile: a cluster of a fleet file can make
// its first node real. gpudra's container gets a copy of the file: the
// DaemonSet's --fleet is the copy's path, mounted from the host at that
// path, and the copy describes the same node as the file the cluster
// loaded.
func TestRealNodeSimulatesTheFleetFile(t *testing.T) {
	dir := t.TempDir()
	userFile := filepath.Join(dir, "my-fleet.yaml")
	const text = `nodes:
- name: lab-0
  gpus:
  - model: H100-SXM5-80GB
  - model: H100-SXM5-80GB
`
	if err := os.WriteFile(userFile, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	fleet, err := simfleet.Load(userFile)
	if err != nil {
		t.Fatal(err)
	}
	r := &RealNodes{Count: 1, FleetName: userFile}
	if err := r.validate(fleet); err != nil {
		t.Fatalf("validate: %v", err)
	}
	clusterDir := filepath.Join(dir, "cluster")
	if err := os.Mkdir(clusterDir, 0o755); err != nil {
		t.Fatal(err)
	}
	path, err := r.containerFleet(clusterDir)
	if err != nil {
		t.Fatal(err)
	}
	if !filepath.IsAbs(path) || filepath.Dir(path) != clusterDir {
		t.Errorf("container fleet %q, want an absolute path in the cluster's directory %s", path, clusterDir)
	}
	copied, err := simfleet.Load(path)
	if err != nil {
		t.Fatalf("the container's fleet file: %v", err)
	}
	n, err := copied.Node("lab-0")
	if err != nil || len(n.GPUs) != 2 {
		t.Fatalf("the container's fleet has node lab-0 with %v GPUs (%v), want the file's 2", n, err)
	}

	// Short: the layout's socket paths must fit in a unix socket path.
	short, err := os.MkdirTemp("", "rn")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(short) })
	layout, err := node.NewLayout(short)
	if err != nil {
		t.Fatal(err)
	}
	ds, _, err := realNodeDaemonSet(nil, "gpudra", "lab-0", layout, fleet.Nodes[0], path, "https://127.0.0.1:6443", false)
	if err != nil {
		t.Fatal(err)
	}
	spec := ds.Spec.Template.Spec
	var plugin corev1.Container
	for _, c := range spec.Containers {
		if c.Name == "plugin" {
			plugin = c
		}
	}
	if !slices.Contains(plugin.Args, "--fleet="+path) {
		t.Errorf("plugin args %q lack --fleet=%s", plugin.Args, path)
	}
	if !slices.ContainsFunc(plugin.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == path && m.ReadOnly }) {
		t.Errorf("the fleet file %s is not mounted read-only into the plugin: %+v", path, plugin.VolumeMounts)
	}
	if !slices.ContainsFunc(spec.Volumes, func(v corev1.Volume) bool { return v.HostPath != nil && v.HostPath.Path == path }) {
		t.Errorf("no hostPath volume of the fleet file %s: %+v", path, spec.Volumes)
	}

	builtin := &RealNodes{Count: 1, FleetName: "dgx-h100"}
	if got, err := builtin.containerFleet(clusterDir); err != nil || got != "dgx-h100" {
		t.Errorf("container fleet of a built-in fleet: %q, %v; want its name", got, err)
	}
}
