package containerruntime

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/BurntSushi/toml"
)

// layout is where everything of one runtime lies, under its node
// directory.
type layout struct {
	dir string
}

func (l layout) root() string       { return filepath.Join(l.dir, "root") }
func (l layout) state() string      { return filepath.Join(l.dir, "state") }
func (l layout) socket() string     { return filepath.Join(l.dir, "containerd.sock") }
func (l layout) configFile() string { return filepath.Join(l.dir, "containerd.toml") }
func (l layout) logFile() string    { return filepath.Join(l.dir, "containerd.log") }
func (l layout) runcRoot() string   { return filepath.Join(l.dir, "runc") }
func (l layout) cniConfDir() string { return filepath.Join(l.dir, "cni", "net.d") }
func (l layout) ipamDir() string    { return filepath.Join(l.dir, "cni", "ipam") }
func (l layout) imagesDir() string  { return filepath.Join(l.dir, "images") }

// containerdConfig is containerd 2.x's configuration (version 3) for one
// node: every root, state directory and socket under the node directory,
// the CRI plugin with the node's CDI spec directories, runc with cgroupfs,
// and the pause image pinned as the sandbox image.
func containerdConfig(l layout, cfg Config) map[string]any {
	return map[string]any{
		"version": 3,
		"root":    l.root(),
		"state":   l.state(),
		// containerd must not raise its own OOM score: that needs
		// CAP_SYS_RESOURCE, which the machines this runs on lack.
		"oom_score": 0,
		"grpc":      map[string]any{"address": l.socket()},
		"ttrpc":     map[string]any{"address": l.socket() + ".ttrpc"},
		// NRI's socket and the opt plugin's directory are machine-wide
		// paths (/var/run/nri, /opt/containerd) that several nodes would
		// share; neither is needed.
		"disabled_plugins": []string{"io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt"},
		"plugins": map[string]any{
			"io.containerd.cri.v1.runtime": map[string]any{
				// CDI is always on in containerd 2.x (enable_cdi is
				// ignored); the spec directories are the node's.
				"cdi_spec_dirs": cfg.CDIDirs,
				// Without CAP_SYS_RESOURCE, a container may not get an
				// OOM score below containerd's own.
				"restrict_oom_score_adj":       true,
				"netns_mounts_under_state_dir": true,
				// cgroup v1 is all these machines have; the warning
				// would show as a false CRI condition forever.
				"ignore_deprecation_warnings": []string{"io.containerd.deprecation/cgroup-v1"},
				"containerd": map[string]any{
					"default_runtime_name": "runc",
					"runtimes": map[string]any{
						"runc": map[string]any{
							"runtime_type": "io.containerd.runc.v2",
							"options": map[string]any{
								"BinaryName": cfg.Binaries.Runc,
								"Root":       l.runcRoot(),
								// cgroupfs: the machines have no
								// systemd; the kubelet is configured
								// with the same driver.
								"SystemdCgroup": false,
							},
						},
					},
				},
				"cni": map[string]any{
					"bin_dirs": []string{cfg.Binaries.Dir},
					"conf_dir": l.cniConfDir(),
				},
			},
			"io.containerd.cri.v1.images": map[string]any{
				"snapshotter":   "overlayfs",
				"pinned_images": map[string]any{"sandbox": PauseImage},
			},
			"io.containerd.grpc.v1.cri": map[string]any{
				"disable_tcp_service":   true,
				"stream_server_address": "127.0.0.1",
				"stream_server_port":    "0",
			},
			"io.containerd.snapshotter.v1.overlayfs": map[string]any{
				"root_path": cfg.SnapshotterRoot,
			},
		},
	}
}

// writeContainerdConfig writes containerd's configuration file.
func writeContainerdConfig(l layout, cfg Config) error {
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(containerdConfig(l, cfg)); err != nil {
		return fmt.Errorf("encode containerd config: %w", err)
	}
	if err := os.WriteFile(l.configFile(), buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("write containerd config: %w", err)
	}
	return nil
}

// cniConfig is the pod network: a bridge of the node's own with
// host-local addresses from the node's pod CIDR. No IP masquerading and
// no portmap: both need iptables or nft, which the machines lack; traffic
// leaving the node is not masqueraded, and hostPort is not supported.
func cniConfig(l layout, cfg Config) map[string]any {
	return map[string]any{
		"cniVersion": "1.0.0",
		"name":       "gpudra-pods",
		"plugins": []any{
			map[string]any{
				"type":        "bridge",
				"bridge":      cfg.Bridge,
				"isGateway":   true,
				"ipMasq":      false,
				"hairpinMode": true,
				"ipam": map[string]any{
					"type":    "host-local",
					"ranges":  [][]map[string]string{{{"subnet": cfg.PodCIDR}}},
					"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
					"dataDir": l.ipamDir(),
				},
			},
		},
	}
}

func writeCNIConfig(l layout, cfg Config) error {
	if err := os.MkdirAll(l.cniConfDir(), 0o755); err != nil {
		return fmt.Errorf("CNI config: %w", err)
	}
	b, err := json.MarshalIndent(cniConfig(l, cfg), "", "  ")
	if err != nil {
		return fmt.Errorf("CNI config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(l.cniConfDir(), "10-gpudra.conflist"), b, 0o644); err != nil {
		return fmt.Errorf("CNI config: %w", err)
	}
	return nil
}
