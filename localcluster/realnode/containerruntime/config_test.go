package containerruntime

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

// fakeBinaries is a Binaries whose directory holds empty files of every
// name: enough for Config's checks, which do not run them.
func fakeBinaries(t *testing.T) Binaries {
	t.Helper()
	dir := t.TempDir()
	for _, name := range binaryNames {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return Binaries{Dir: dir, Runc: "/usr/sbin/runc"}
}

// TestContainerdConfig writes containerd's configuration and reads it
// back: the settings the machine imposes are there, and every path lies
// under the node directory, the binaries' directory or is runc.
func TestContainerdConfig(t *testing.T) {
	b := fakeBinaries(t)
	dir := t.TempDir()
	cfg := Config{Dir: dir, CDIDirs: []string{"/var/run/cdi-node-0"}, Binaries: b}
	if err := cfg.complete(); err != nil {
		t.Fatal(err)
	}
	cfg.SnapshotterRoot = filepath.Join(dir, "root", "snapshots")
	l := layout{dir: dir}
	if err := writeContainerdConfig(l, cfg); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if _, err := toml.DecodeFile(l.configFile(), &got); err != nil {
		t.Fatal(err)
	}
	runtime := []string{"plugins", "io.containerd.cri.v1.runtime"}
	runc := append(runtime, "containerd", "runtimes", "runc")
	tests := []struct {
		path []string
		want any
	}{
		{[]string{"version"}, int64(3)},
		{[]string{"oom_score"}, int64(0)},
		{[]string{"grpc", "address"}, filepath.Join(dir, "containerd.sock")},
		{append(runtime, "cdi_spec_dirs"), []any{"/var/run/cdi-node-0"}},
		{append(runtime, "restrict_oom_score_adj"), true},
		{append(runtime, "containerd", "default_runtime_name"), "runc"},
		{append(runc, "runtime_type"), "io.containerd.runc.v2"},
		{append(runc, "options", "SystemdCgroup"), false},
		{append(runc, "options", "BinaryName"), "/usr/sbin/runc"},
		{append(runtime, "cni", "bin_dirs"), []any{b.Dir}},
		{[]string{"plugins", "io.containerd.cri.v1.images", "pinned_images", "sandbox"}, PauseImage},
		{[]string{"plugins", "io.containerd.snapshotter.v1.overlayfs", "root_path"}, cfg.SnapshotterRoot},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.path, "."), func(t *testing.T) {
			var v any = got
			for _, k := range tc.path {
				m, ok := v.(map[string]any)
				if !ok {
					t.Fatalf("%s: not a table", k)
				}
				v = m[k]
			}
			if !reflect.DeepEqual(v, tc.want) {
				t.Errorf("%v (%T), want %v (%T)", v, v, tc.want, tc.want)
			}
		})
	}
	var walk func(key string, v any)
	walk = func(key string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				walk(key+"."+k, e)
			}
		case []any:
			for _, e := range v {
				walk(key, e)
			}
		case string:
			if !strings.HasPrefix(v, "/") || key == ".plugins.io.containerd.cri.v1.runtime.cdi_spec_dirs" {
				return
			}
			if !strings.HasPrefix(v, dir+"/") && !strings.HasPrefix(v, b.Dir) && v != b.Runc {
				t.Errorf("%s = %s lies outside the node directory", key, v)
			}
		}
	}
	walk("", got)
}

// TestCNIConfig checks the pod network: the node's bridge and CIDR, its
// addresses kept under the node directory, and no plugin that needs
// iptables.
func TestCNIConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Dir: dir, Binaries: fakeBinaries(t), PodCIDR: "10.200.3.0/24", Bridge: "gpudra3"}
	if err := cfg.complete(); err != nil {
		t.Fatal(err)
	}
	l := layout{dir: dir}
	if err := writeCNIConfig(l, cfg); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(l.cniConfDir(), "10-gpudra.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Plugins []struct {
			Type, Bridge string
			IPMasq       bool
			IPAM         struct {
				Type    string
				Ranges  [][]struct{ Subnet string }
				DataDir string
			}
		}
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Plugins) != 1 {
		t.Fatalf("%d plugins, want the bridge alone:\n%s", len(got.Plugins), b)
	}
	p := got.Plugins[0]
	if p.Type != "bridge" || p.Bridge != "gpudra3" || p.IPMasq || p.IPAM.Type != "host-local" ||
		len(p.IPAM.Ranges) != 1 || len(p.IPAM.Ranges[0]) != 1 || p.IPAM.Ranges[0][0].Subnet != "10.200.3.0/24" ||
		p.IPAM.DataDir != l.ipamDir() {
		t.Errorf("CNI config:\n%s", b)
	}
}

// TestStartRefusesBadConfig checks that Start names the field of a bad
// Config before it touches the machine.
func TestStartRefusesBadConfig(t *testing.T) {
	b := fakeBinaries(t)
	dir := t.TempDir()
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"no dir", Config{Binaries: b}, "Config.Dir is empty"},
		{"dir too long", Config{Dir: "/" + strings.Repeat("d", 100), Binaries: b}, "too long for containerd's socket"},
		{"no binaries", Config{Dir: dir}, "Config.Binaries is empty"},
		{"binaries missing", Config{Dir: dir, Binaries: Binaries{Dir: t.TempDir(), Runc: "/usr/sbin/runc"}}, "Config.Binaries:"},
		{"bad pod CIDR", Config{Dir: dir, Binaries: b, PodCIDR: "10.88.0.0"}, "Config.PodCIDR"},
		{"long bridge", Config{Dir: dir, Binaries: b, Bridge: "gpudra-bridge-0001"}, `Config.Bridge "gpudra-bridge-0001" is longer than 15 characters`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rt, err := Start(context.Background(), tc.cfg)
			if err == nil {
				_ = rt.Stop()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
