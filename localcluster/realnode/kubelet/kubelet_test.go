package kubelet

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	kubeletconfig "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"
)

func TestConfigValidate(t *testing.T) {
	good := Config{Binary: "/k", NodeName: "n", RootDir: "/r", PodLogsDir: "/l", Kubeconfig: "/kc", RuntimeEndpoint: "unix:///c.sock", CertFile: "/c", KeyFile: "/k"}
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"good", func(*Config) {}, ""},
		{"no node name", func(c *Config) { c.NodeName = "" }, "NodeName"},
		{"no root", func(c *Config) { c.RootDir = "" }, "RootDir"},
		{"tcp endpoint", func(c *Config) { c.RuntimeEndpoint = "tcp://127.0.0.1:1" }, "RuntimeEndpoint"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.change(&c)
			err := c.Validate()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("Validate: %v, want an error naming %q", err, tc.want)
			}
		})
	}
}

// TestConfiguration decodes the written configuration strictly and checks
// what the machine imposes.
func TestConfiguration(t *testing.T) {
	out, err := configuration(Config{NodeName: "n", RootDir: "/r", PodLogsDir: "/l", RuntimeEndpoint: "unix:///c.sock", CertFile: "/c", KeyFile: "/k"}, 10250, 10248)
	if err != nil {
		t.Fatal(err)
	}
	var c kubeletconfig.KubeletConfiguration
	if err := yaml.UnmarshalStrict(out, &c); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if c.Kind != "KubeletConfiguration" || c.APIVersion != "kubelet.config.k8s.io/v1beta1" {
		t.Errorf("kind %s apiVersion %s", c.Kind, c.APIVersion)
	}
	checks := []struct {
		what string
		ok   bool
	}{
		{"cgroupfs driver", c.CgroupDriver == "cgroupfs"},
		{"cgroup v1 allowed", c.FailCgroupV1 != nil && !*c.FailCgroupV1},
		{"no QoS cgroups", c.CgroupsPerQOS != nil && !*c.CgroupsPerQOS},
		{"no node allocatable enforcement", len(c.EnforceNodeAllocatable) == 1 && c.EnforceNodeAllocatable[0] == "none"},
		{"swap allowed", c.FailSwapOn != nil && !*c.FailSwapOn},
		{"API on loopback", c.Address == "127.0.0.1" && c.Port == 10250 && c.ReadOnlyPort == 0},
		{"CRI endpoint", c.ContainerRuntimeEndpoint == "unix:///c.sock"},
		{"pod logs", c.PodLogsDir == "/l"},
		{"serving certificate", c.TLSCertFile == "/c" && c.TLSPrivateKeyFile == "/k"},
		{"images never collected", c.ImageGCHighThresholdPercent != nil && *c.ImageGCHighThresholdPercent == 100},
	}
	for _, ch := range checks {
		if !ch.ok {
			t.Errorf("%s: not so in\n%s", ch.what, out)
		}
	}
}

func TestArgs(t *testing.T) {
	a := strings.Join(args(Config{NodeName: "node-0", RootDir: "/r", Kubeconfig: "/kc", Labels: map[string]string{"b": "2", "a": "1"}}, "/r/c.yaml"), " ")
	for _, want := range []string{"--config=/r/c.yaml", "--hostname-override=node-0", "--root-dir=/r", "--kubeconfig=/kc", "--node-labels=a=1,b=2"} {
		if !strings.Contains(a, want) {
			t.Errorf("args %s lack %s", a, want)
		}
	}
}

func TestMajorMinor(t *testing.T) {
	for _, tc := range []struct {
		in           string
		major, minor string
		ok           bool
	}{
		{"v1.37.1", "1", "37", true},
		{"1.37.1", "", "", false},
		{"v1.37", "", "", false},
	} {
		major, minor, ok := majorMinor(tc.in)
		if major != tc.major || minor != tc.minor || ok != tc.ok {
			t.Errorf("majorMinor(%q) = %q %q %v", tc.in, major, minor, ok)
		}
	}
}

// TestParseCRILog reads a log in the CRI format with a partial line.
func TestParseCRILog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	log := "2026-11-28T15:00:00.1Z stdout F hello\n2026-11-28T15:00:00.2Z stderr P par\n2026-11-28T15:00:00.3Z stderr F tial\n2026-11-28T15:00:00.4Z stdout F \n"
	if err := os.WriteFile(path, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := parseCRILog(f)
	if err != nil || got != "hello\npartial\n\n" {
		t.Errorf("parseCRILog: %q, %v", got, err)
	}
}

// TestTunablesRestored checks that the machine's sysctls come back when
// the last of two kubelets stops, and not before.
func TestTunablesRestored(t *testing.T) {
	dir := t.TempDir()
	old := procSys
	procSys = dir
	t.Cleanup(func() { procSys = old })
	write := func(name, v string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(dir, name))
		return strings.TrimSpace(string(b))
	}
	for _, name := range kernelTunables {
		write(name, "0")
	}
	if err := saveTunables(); err != nil {
		t.Fatal(err)
	}
	if err := saveTunables(); err != nil {
		t.Fatal(err)
	}
	if got := ChangedSysctls(); len(got) != 0 {
		t.Errorf("ChangedSysctls before any change: %q", got)
	}
	write("vm/overcommit_memory", "1") // what the kubelet does
	write("kernel/panic", "10")
	if got, want := ChangedSysctls(), []string{"vm.overcommit_memory=1 (was 0)", "kernel.panic=10 (was 0)"}; !slices.Equal(got, want) {
		t.Errorf("ChangedSysctls: %q, want %q", got, want)
	}
	if err := restoreTunables(); err != nil {
		t.Fatal(err)
	}
	if got := read("vm/overcommit_memory"); got != "1" {
		t.Errorf("restored to %s while a kubelet still runs", got)
	}
	if err := restoreTunables(); err != nil {
		t.Fatal(err)
	}
	if got := read("vm/overcommit_memory"); got != "0" {
		t.Errorf("vm/overcommit_memory %s after the last kubelet stopped, want the machine's 0", got)
	}
	if got := ChangedSysctls(); len(got) != 0 {
		t.Errorf("ChangedSysctls after the last kubelet stopped: %q", got)
	}
}
