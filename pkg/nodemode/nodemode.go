// Package nodemode keeps a node in one mode: a DRA plugin of gpudra's
// driver, or a device plugin for nvidia.com/gpu (gpudra's or NVIDIA's),
// never both, since each would admit pods to the same GPUs. Each mode
// looks, at start, for the other one's sockets accepting connections.
package nodemode

import (
	"net"
	"path/filepath"
	"slices"
	"time"
)

// DefaultDevicePluginDir is the kubelet's device-plugin directory.
const DefaultDevicePluginDir = "/var/lib/kubelet/device-plugins"

// DRAPluginListening returns the DRA socket (dra.sock, or dra-<uid>.sock
// during a rolling update) in a DRA driver's plugin directory that accepts
// connections; "" if none does.
func DRAPluginListening(dir string) string {
	return listening(filepath.Join(dir, "dra*.sock"))
}

// DevicePluginListening returns the socket in the kubelet's device-plugin
// directory of a device plugin serving NVIDIA GPUs that accepts
// connections: gpudra's (gpudra-*.sock) or NVIDIA's (nvidia-gpu.sock,
// nvidia-mig-*.sock, nvidia.com_gpu*.sock); "" if none does. The kubelet's
// own kubelet.sock is not a plugin.
func DevicePluginListening(dir string) string {
	for _, pattern := range []string{"gpudra-*.sock", "nvidia-gpu*.sock", "nvidia-mig-*.sock", "nvidia.com_*.sock"} {
		if sock := listening(filepath.Join(dir, pattern)); sock != "" {
			return sock
		}
	}
	return ""
}

func listening(pattern string) string {
	socks, _ := filepath.Glob(pattern)
	slices.Sort(socks)
	for _, sock := range socks {
		conn, err := net.DialTimeout("unix", sock, time.Second)
		if err == nil {
			_ = conn.Close()
			return sock
		}
	}
	return ""
}

// Label is the node label that says which mode a node runs in; the Helm
// chart's DaemonSets select on it, so that no node runs both. A node
// without it runs the DRA plugin.
const Label = "gpudra.io/mode"

// The values of [Label].
const (
	// ModeDRA: gpudra's DRA kubelet plugin (also a node without the label).
	ModeDRA = "dra"
	// ModeDevicePlugin: a device plugin for nvidia.com/gpu, gpudra's
	// (`gpudra device-plugin`) or NVIDIA's.
	ModeDevicePlugin = "device-plugin"
)
