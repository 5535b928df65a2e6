package node

import (
	"fmt"
	"path/filepath"
)

// Layout is where a real node keeps things, under its node directory.
// Every host path of gpudra's pod lies under it: the node directory is a
// shared mount (containerruntime bind-mounts it), which the chart's
// Bidirectional and HostToContainer mounts need, and `/` on the machines
// this runs on is private.
type Layout struct{ dir, kubeletRoot string }

// podUIDLength is the length of a real pod's UID, which the DRA plugin
// puts in its socket names.
const podUIDLength = 36

// NewLayout returns the layout under dir, or an error where a socket of
// gpudra's plugin (named with a real pod's UID) would not fit in a unix
// socket path.
func NewLayout(dir string) (Layout, error) {
	l := Layout{dir: dir, kubeletRoot: "k"}
	// kubeletplugin v0.37.1 names the registration socket
	// <driver>-<pod UID>-reg.sock when that path is at most 108 bytes,
	// one more than a unix socket path can hold, and a hashed name when
	// it is longer: exactly 108 fails. A longer root's name moves it off.
	if len(l.registrationSocket("gpu.nvidia.com")) == 108 {
		l.kubeletRoot = "k_"
	}
	return l.checked()
}

func (l Layout) checked() (Layout, error) {
	if sock := filepath.Join(l.PluginsDir(), "gpu.nvidia.com", "dra-"+fmt.Sprintf("%0*d", podUIDLength, 0)+".sock"); len(sock) > 107 {
		return Layout{}, fmt.Errorf("node directory %s is too long: the plugin's socket %s would be %d bytes, at most 107", l.dir, sock, len(sock))
	}
	return l, nil
}

func (l Layout) registrationSocket(driver string) string {
	return filepath.Join(l.RegistryDir(), fmt.Sprintf("%s-%0*d-reg.sock", driver, podUIDLength, 0))
}

// KubeletRoot is the kubelet's --root-dir, short for the sockets below
// it.
func (l Layout) KubeletRoot() string { return filepath.Join(l.dir, l.kubeletRoot) }

// PluginsDir is <root>/plugins; RegistryDir <root>/plugins_registry.
func (l Layout) PluginsDir() string { return filepath.Join(l.KubeletRoot(), "plugins") }

// RegistryDir is the kubelet's plugin registration directory.
func (l Layout) RegistryDir() string { return filepath.Join(l.KubeletRoot(), "plugins_registry") }

// PodLogsDir is the kubelet's podLogsDir.
func (l Layout) PodLogsDir() string { return filepath.Join(l.dir, "pod-logs") }

// CDIDir is where gpudra writes CDI specs and containerd reads them.
func (l Layout) CDIDir() string { return filepath.Join(l.dir, "cdi") }

// DriverRoot is the chart's driverRoot on this node: the simulated GPUs'
// device nodes lie in its dev/ (see package devnodes).
func (l Layout) DriverRoot() string { return filepath.Join(l.dir, "driver") }

// MPSRoot is the MPS daemons' root (the chart's kubeletPlugin.mps.root).
func (l Layout) MPSRoot() string { return filepath.Join(l.dir, "mps") }

// SimStateDir keeps the simulated GPUs' state across restarts of gpudra's
// container (simulation.stateDir).
func (l Layout) SimStateDir() string { return filepath.Join(l.dir, "sim") }
