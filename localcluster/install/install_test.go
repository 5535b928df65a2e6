package install

import (
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpudra/gpudra/pkg/pluginflags"
	"github.com/gpudra/gpudra/pkg/webhook"
)

// TestRenderRefusesWrongType: a value of the wrong type is refused at
// install, naming it, before anything is applied.
func TestRenderRefusesWrongType(t *testing.T) {
	_, err := Render(Options{Values: map[string]any{"kubeletPlugin": map[string]any{"kubeAPIQPS": "fast"}}})
	if err == nil || !strings.Contains(err.Error(), "kubeAPIQPS") {
		t.Fatalf("kubeletPlugin.kubeAPIQPS: \"fast\": error %v, want one naming the value", err)
	}
}

// TestPodArgs: the kubelet plugin's and the webhook's container arguments,
// expanded and with their paths moved to the pod's volumes, parse with
// the binaries' own flag sets into what the chart's values say.
func TestPodArgs(t *testing.T) {
	r, err := Render(Options{Namespace: "gpu-system", Values: map[string]any{"kubeletPlugin": map[string]any{"kubeAPIQPS": 7, "migMode": "static"}}})
	if err != nil {
		t.Fatal(err)
	}
	objs, err := r.Manifests()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if k := o.GetKind(); k == "DaemonSet" || k == "Deployment" {
			t.Errorf("the workload %s %s is among the objects to apply", k, o.GetName())
		}
	}
	if objs[0].GetKind() != "Namespace" || objs[0].GetName() != "gpu-system" {
		t.Errorf("first object %s %s, want the release's Namespace gpu-system", objs[0].GetKind(), objs[0].GetName())
	}

	node := t.TempDir()
	volume := func(v corev1.Volume) (string, error) { return filepath.Join(node, v.Name), nil }
	args, err := r.KubeletPlugin.Args(Instance{NodeName: "node-a", UID: "uid-1", Volume: volume})
	if err != nil {
		t.Fatal(err)
	}
	if args[0] != "kubelet-plugin" {
		t.Fatalf("args %q: want kubelet-plugin first", args)
	}
	flags, fs, err := pluginflags.ParseKubeletPlugin(args[1:])
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, got, want string }{
		{"--node-name", flags.NodeName, "node-a"},
		{"--pod-uid", flags.PodUID, "uid-1"},
		{"--plugin-data-dir", flags.PluginDataDir, filepath.Join(node, "plugins", "gpu.nvidia.com")},
		{"--registrar-dir", flags.RegistrarDir, filepath.Join(node, "plugins-registry")},
		{"--cdi-dir", flags.CDIDir, filepath.Join(node, "cdi")},
		{"--sysfs-root", flags.HW.SysfsRoot, filepath.Join(node, "sysfs")},
		{"--mig-mode", flags.MIGMode, "static"},
	} {
		if c.got != c.want {
			t.Errorf("%s %q, want %q", c.name, c.got, c.want)
		}
	}
	if flags.KubeAPIQPS != 7 || !fs.Changed("kube-api-qps") {
		t.Errorf("--kube-api-qps %v, want the value 7", flags.KubeAPIQPS)
	}
	if r.KubeletPlugin.ServiceAccount() != "gpudra-kubelet-plugin" || r.KubeletPlugin.Namespace != "gpu-system" {
		t.Errorf("plugin runs as %s/%s", r.KubeletPlugin.Namespace, r.KubeletPlugin.ServiceAccount())
	}

	args, err = r.Webhook.Args(Instance{UID: "uid-2", Volume: volume})
	if err != nil {
		t.Fatal(err)
	}
	if args[0] != "webhook" {
		t.Fatalf("args %q: want webhook first", args)
	}
	wf, err := webhook.ParseFlags(args[1:])
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(node, "tls"); wf.SelfSignedDir != want {
		t.Errorf("--self-signed-dir %q, want %q", wf.SelfSignedDir, want)
	}
	if !strings.Contains(strings.Join(wf.SelfSignedHosts, ","), "gpudra-webhook.gpu-system.svc") {
		t.Errorf("--self-signed-hosts %v: want the Service's name", wf.SelfSignedHosts)
	}
	if r.WebhookService == nil || r.WebhookService.Namespace != "gpu-system" {
		t.Errorf("webhook Service %v", r.WebhookService)
	}
}

// TestMapPath: the deepest mount wins, and paths outside every mount and
// relative ones stay as they are.
func TestMapPath(t *testing.T) {
	mounts := []mount{{"/var/lib/kubelet/plugins", "/n/plugins"}, {"/var/lib/kubelet/plugins_registry", "/n/reg"}, {"/var/lib/kubelet", "/n/kubelet"}}
	for in, want := range map[string]string{
		"/var/lib/kubelet/plugins/gpu.nvidia.com": "/n/plugins/gpu.nvidia.com",
		"/var/lib/kubelet/plugins_registry":       "/n/reg",
		"/var/lib/kubelet/pods":                   "/n/kubelet/pods",
		"/var/lib/kubeletx":                       "/var/lib/kubeletx",
		"relative/path":                           "relative/path",
	} {
		if got := mapPath(in, mounts); got != want {
			t.Errorf("mapPath(%q) = %q, want %q", in, got, want)
		}
	}
}
