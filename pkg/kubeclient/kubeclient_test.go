package kubeclient

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestFlags(t *testing.T) {
	t.Setenv("KUBECONFIG", "")
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	var f Flags
	f.AddFlags(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if f.KubeAPIQPS != DefaultKubeAPIQPS || f.KubeAPIBurst != DefaultKubeAPIBurst || f.Validate() != nil {
		t.Errorf("defaults %+v (validate: %v)", f, f.Validate())
	}
	for args, want := range map[string]string{"--kube-api-qps=0": "--kube-api-qps 0", "--kube-api-burst=0": "--kube-api-burst 0"} {
		var g Flags
		fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
		g.AddFlags(fs)
		if err := fs.Parse([]string{args}); err != nil {
			t.Fatal(err)
		}
		if err := g.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Validate = %v, want an error naming %s", args, err, want)
		}
	}
}

func TestRESTConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	kubeconfig := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:6443"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	f := Flags{Kubeconfig: path, KubeAPIQPS: 7, KubeAPIBurst: 9}
	cfg, err := f.RESTConfig("kubelet-plugin")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://127.0.0.1:6443" || cfg.QPS != 7 || cfg.Burst != 9 || !strings.HasPrefix(cfg.UserAgent, "gpudra-kubelet-plugin/") {
		t.Errorf("config: host %q, QPS %v, burst %d, user agent %q", cfg.Host, cfg.QPS, cfg.Burst, cfg.UserAgent)
	}
	if _, err := (&Flags{Kubeconfig: filepath.Join(t.TempDir(), "missing")}).RESTConfig("x"); err == nil {
		t.Error("a missing kubeconfig gave a config")
	}
}
