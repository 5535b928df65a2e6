package install

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"helm.sh/helm/v3/pkg/chart"

	"github.com/gpudra/gpudra/deployments/deviceclasses"
	"github.com/gpudra/gpudra/deployments/rbac"
)

// values builds nested values from dotted paths and values, as helm
// install --set does: values("a.b", 1) is {a: {b: 1}}.
func values(pathsAndValues ...any) map[string]any {
	out := map[string]any{}
	for i := 0; i < len(pathsAndValues); i += 2 {
		path := strings.Split(pathsAndValues[i].(string), ".")
		m := out
		for _, key := range path[:len(path)-1] {
			next, ok := m[key].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[key] = next
			}
			m = next
		}
		m[path[len(path)-1]] = pathsAndValues[i+1]
	}
	return out
}

func loadChart(t *testing.T) *chart.Chart {
	t.Helper()
	c, err := LoadChart(ChartDir())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func render(t *testing.T, opts Options) []Object {
	t.Helper()
	objs, err := RenderChart(loadChart(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// find returns the one object of type T named name, or fails.
func find[T any](t *testing.T, objs []Object, name string) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		if typed, ok := o.Object.(T); ok && o.Name == name {
			found = append(found, typed)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want one %T %q, found %d", zero, name, len(found))
	}
	return found[0]
}

// all returns every object of type T.
func all[T any](objs []Object) []T {
	var out []T
	for _, o := range objs {
		if typed, ok := o.Object.(T); ok {
			out = append(out, typed)
		}
	}
	return out
}

func kinds(objs []Object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.String())
	}
	return out
}

func pluginContainer(t *testing.T, objs []Object) (*appsv1.DaemonSet, corev1.Container) {
	t.Helper()
	ds := find[*appsv1.DaemonSet](t, objs, "gpudra-kubelet-plugin")
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == "plugin" {
			return ds, c
		}
	}
	t.Fatal("DaemonSet has no container named plugin")
	return nil, corev1.Container{}
}

// flagValue returns the value of --name in args and whether it is there.
func flagValue(args []string, name string) (string, bool) {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// TestRender renders each documented value combination and checks what
// that combination is for. Every render also decodes each object strictly
// (Render fails on an unknown, duplicate or mistyped field).
func TestRender(t *testing.T) {
	for _, tc := range []struct {
		name      string
		namespace string
		values    map[string]any
		check     func(t *testing.T, objs []Object)
	}{
		{
			name: "defaults",
			check: func(t *testing.T, objs []Object) {
				want := []string{
					"ServiceAccount gpudra/gpudra-compute-domain-controller", "ClusterRole gpudra-compute-domain-controller", "ClusterRoleBinding gpudra-compute-domain-controller",
					"Role gpudra/gpudra-compute-domain-controller", "RoleBinding gpudra/gpudra-compute-domain-controller", "Deployment gpudra/gpudra-compute-domain-controller",
					"ClusterRole gpudra-compute-domain-kubelet-plugin", "ClusterRoleBinding gpudra-compute-domain-kubelet-plugin",
					"Role gpudra/gpudra-compute-domain-kubelet-plugin", "RoleBinding gpudra/gpudra-compute-domain-kubelet-plugin",
					"CustomResourceDefinition computedomaincliques.resource.nvidia.com", "CustomResourceDefinition computedomains.resource.nvidia.com",
				}
				for _, c := range allClasses(t) {
					want = append(want, "DeviceClass "+c.Name)
				}
				want = append(want,
					"DaemonSet gpudra/gpudra-kubelet-plugin",
					"ServiceAccount gpudra/gpudra-kubelet-plugin", "ClusterRole gpudra-kubelet-plugin", "ClusterRoleBinding gpudra-kubelet-plugin",
					"ValidatingAdmissionPolicy gpudra-resourceslices-own-node", "ValidatingAdmissionPolicyBinding gpudra-resourceslices-own-node",
					"ServiceAccount gpudra/gpudra-webhook", "ClusterRole gpudra-webhook", "ClusterRoleBinding gpudra-webhook",
					"Deployment gpudra/gpudra-webhook", "Service gpudra/gpudra-webhook", "ValidatingWebhookConfiguration gpudra-webhook",
				)
				if got := kinds(objs); !slices.Equal(got, want) {
					t.Errorf("objects:\n got %q\nwant %q", got, want)
				}
				checkDaemonSet(t, objs)
				checkWebhook(t, objs, "gpudra")
				checkComputeDomains(t, objs, "compute-domain.nvidia.com")
				class := find[*resourceapi.DeviceClass](t, objs, deviceclasses.GPU)
				if class.Spec.ExtendedResourceName == nil || *class.Spec.ExtendedResourceName != "nvidia.com/gpu" {
					t.Errorf("gpu.nvidia.com extendedResourceName %v, want nvidia.com/gpu", class.Spec.ExtendedResourceName)
				}
			},
		},
		{
			name:   "extendedResourceName off",
			values: values("deviceClasses.extendedResourceName", false),
			check: func(t *testing.T, objs []Object) {
				for _, class := range all[*resourceapi.DeviceClass](objs) {
					if class.Spec.ExtendedResourceName != nil {
						t.Errorf("%s: extendedResourceName %q, want none", class.Name, *class.Spec.ExtendedResourceName)
					}
				}
				if n, want := len(all[*resourceapi.DeviceClass](objs)), len(allClasses(t)); n != want {
					t.Errorf("%d DeviceClasses, want %d", n, want)
				}
			},
		},
		{
			name:   "DeviceClasses off",
			values: values("deviceClasses.enabled", false),
			check: func(t *testing.T, objs []Object) {
				if n := len(all[*resourceapi.DeviceClass](objs)); n != 0 {
					t.Errorf("%d DeviceClasses, want none", n)
				}
			},
		},
		{
			name:   "MIG static",
			values: values("kubeletPlugin.migMode", "static"),
			check: func(t *testing.T, objs []Object) {
				_, c := pluginContainer(t, objs)
				if v, _ := flagValue(c.Args, "mig-mode"); v != "static" {
					t.Errorf("--mig-mode=%q, want static", v)
				}
			},
		},
		{
			name:   "MIG dynamic with mode switching",
			values: values("kubeletPlugin.migModeSwitching", true),
			check: func(t *testing.T, objs []Object) {
				_, c := pluginContainer(t, objs)
				if v, _ := flagValue(c.Args, "mig-mode-switching"); v != "true" {
					t.Errorf("--mig-mode-switching=%q, want true", v)
				}
			},
		},
		{
			name:   "sharing",
			values: values("kubeletPlugin.sharing", "shares=4", "kubeletPlugin.sharingDefault", "share"),
			check: func(t *testing.T, objs []Object) {
				_, c := pluginContainer(t, objs)
				if v, _ := flagValue(c.Args, "sharing"); v != "shares=4" {
					t.Errorf("--sharing=%q, want shares=4", v)
				}
				if v, _ := flagValue(c.Args, "sharing-default"); v != "share" {
					t.Errorf("--sharing-default=%q, want share", v)
				}
			},
		},
		{
			name:   "VFIO only",
			values: values("kubeletPlugin.vfio", "only", "kubeletPlugin.vfioGPUs", []any{0, 3}, "kubeletPlugin.vfioDriver", "nvgrace-gpu-vfio-pci"),
			check: func(t *testing.T, objs []Object) {
				ds, c := pluginContainer(t, objs)
				for flag, want := range map[string]string{"vfio": "only", "vfio-gpus": "0,3", "vfio-driver": "nvgrace-gpu-vfio-pci"} {
					if v, _ := flagValue(c.Args, flag); v != want {
						t.Errorf("--%s=%q, want %q", flag, v, want)
					}
				}
				if !hasMount(c, "/lib/modules") || !hasVolume(ds, "/lib/modules") {
					t.Error("VFIO needs /lib/modules for its modprobe")
				}
			},
		},
		{
			name:   "VFIO off",
			values: values("kubeletPlugin.vfio", "off"),
			check: func(t *testing.T, objs []Object) {
				ds, c := pluginContainer(t, objs)
				if v, _ := flagValue(c.Args, "vfio"); v != "off" {
					t.Errorf("--vfio=%q, want off", v)
				}
				if hasMount(c, "/lib/modules") || hasVolume(ds, "/lib/modules") {
					t.Error("/lib/modules mounted with VFIO off")
				}
			},
		},
		{
			name:   "GPU operator driver root",
			values: values("kubeletPlugin.driverRoot", "/run/nvidia/driver"),
			check: func(t *testing.T, objs []Object) {
				ds, c := pluginContainer(t, objs)
				if v, _ := flagValue(c.Args, "driver-root"); v != "/run/nvidia/driver" {
					t.Errorf("--driver-root=%q", v)
				}
				if !hasVolume(ds, "/run/nvidia/driver") {
					t.Error("driver root not mounted from the host")
				}
				init := ds.Spec.Template.Spec.InitContainers
				if len(init) != 1 || !slices.Contains(init[0].Args, "--driver-root=/run/nvidia/driver") {
					t.Errorf("the init container does not name the driver root: %v", init)
				}
			},
		},
		{
			name:   "webhook off",
			values: values("webhook.enabled", false),
			check: func(t *testing.T, objs []Object) {
				for _, o := range objs {
					if strings.Contains(o.Name, "webhook") {
						t.Errorf("%s rendered with the webhook off", o)
					}
				}
			},
		},
		{
			name:   "webhook with a certificate Secret",
			values: values("webhook.tls.mode", "secret", "webhook.tls.secretName", "gpudra-webhook-tls", "webhook.tls.caBundle", "Y2E=", "webhook.failurePolicy", "Ignore"),
			check: func(t *testing.T, objs []Object) {
				dep := find[*appsv1.Deployment](t, objs, "gpudra-webhook")
				if v := dep.Spec.Template.Spec.Volumes[0].Secret; v == nil || v.SecretName != "gpudra-webhook-tls" {
					t.Errorf("TLS volume %+v, want the Secret", dep.Spec.Template.Spec.Volumes[0])
				}
				if _, ok := flagValue(dep.Spec.Template.Spec.Containers[0].Args, "self-signed-dir"); ok {
					t.Error("self-signed flags with a certificate Secret")
				}
				vwc := find[*admissionv1.ValidatingWebhookConfiguration](t, objs, "gpudra-webhook")
				if string(vwc.Webhooks[0].ClientConfig.CABundle) != "ca" || *vwc.Webhooks[0].FailurePolicy != admissionv1.Ignore {
					t.Errorf("caBundle %q failurePolicy %v", vwc.Webhooks[0].ClientConfig.CABundle, *vwc.Webhooks[0].FailurePolicy)
				}
				sa := find[*corev1.ServiceAccount](t, objs, "gpudra-webhook")
				if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
					t.Error("a webhook with a certificate Secret needs no API token")
				}
				for _, o := range objs {
					if _, ok := o.Object.(*rbacv1.ClusterRole); ok && o.Name == "gpudra-webhook" {
						t.Error("a webhook with a certificate Secret needs no ClusterRole")
					}
				}
			},
		},
		{
			name:      "custom namespace, not created",
			namespace: "kube-system",
			values:    values("namespace.name", "gpu-system"),
			check: func(t *testing.T, objs []Object) {
				checkNamespace(t, objs, "gpu-system")
				if n := len(all[*corev1.Namespace](objs)); n != 0 {
					t.Errorf("%d Namespaces rendered, want none", n)
				}
			},
		},
		{
			name:      "release namespace",
			namespace: "gpu-operator",
			check: func(t *testing.T, objs []Object) {
				checkNamespace(t, objs, "gpu-operator")
				checkWebhook(t, objs, "gpu-operator")
			},
		},
		{
			name:      "namespace created",
			namespace: "default",
			values:    values("namespace.name", "gpudra", "namespace.create", true),
			check: func(t *testing.T, objs []Object) {
				checkNamespace(t, objs, "gpudra")
				ns := find[*corev1.Namespace](t, objs, "gpudra")
				if ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
					t.Errorf("namespace labels %v: the kubelet plugin needs the privileged level", ns.Labels)
				}
			},
		},
		{
			name:   "another driver name",
			values: values("driverName", "gpu.example.com"),
			check: func(t *testing.T, objs []Object) {
				for _, class := range all[*resourceapi.DeviceClass](objs) {
					expr := class.Spec.Selectors[0].CEL.Expression
					if strings.HasPrefix(class.Name, "compute-domain-") {
						if !strings.Contains(expr, "device.driver == 'compute-domain.nvidia.com'") {
							t.Errorf("%s: selector %q changed with the GPU driver's name", class.Name, expr)
						}
						continue
					}
					if strings.Contains(expr, "gpu.nvidia.com") || !strings.Contains(expr, "device.driver == 'gpu.example.com'") || !strings.Contains(expr, "device.attributes['gpu.example.com']") {
						t.Errorf("%s: selector %q does not select gpu.example.com's devices", class.Name, expr)
					}
				}
				_, c := pluginContainer(t, objs)
				if v, _ := flagValue(c.Args, "plugin-data-dir"); v != "/var/lib/kubelet/plugins/gpu.example.com" {
					t.Errorf("--plugin-data-dir=%q", v)
				}
				role := find[*rbacv1.ClusterRole](t, objs, rbac.KubeletPluginName)
				want, err := rbac.KubeletPlugin("gpudra", "gpu.example.com")
				if err != nil {
					t.Fatal(err)
				}
				if !equality.Semantic.DeepEqual(role.Rules, want.ClusterRole.Rules) {
					t.Errorf("ClusterRole rules\n got %+v\nwant %+v", role.Rules, want.ClusterRole.Rules)
				}
				vap := find[*admissionv1.ValidatingAdmissionPolicy](t, objs, "gpudra-resourceslices-own-node")
				if !strings.Contains(vap.Spec.Validations[2].Expression, "'gpu.example.com'") {
					t.Errorf("policy checks driver by %q", vap.Spec.Validations[2].Expression)
				}
			},
		},
		{
			name:   "network policies",
			values: values("networkPolicy.enabled", true),
			check: func(t *testing.T, objs []Object) {
				plugin := find[*networkingv1.NetworkPolicy](t, objs, "gpudra-kubelet-plugin")
				if len(plugin.Spec.Ingress) != 1 || plugin.Spec.Ingress[0].Ports[0].Port.String() != "http" {
					t.Errorf("plugin ingress %+v, want the http port only", plugin.Spec.Ingress)
				}
				if len(plugin.Spec.Egress) != 2 {
					t.Errorf("plugin egress %+v, want the API server and DNS", plugin.Spec.Egress)
				}
				webhook := find[*networkingv1.NetworkPolicy](t, objs, "gpudra-webhook")
				if len(webhook.Spec.Ingress) != 1 || webhook.Spec.Ingress[0].Ports[0].Port.String() != "https" {
					t.Errorf("webhook ingress %+v", webhook.Spec.Ingress)
				}
			},
		},
		{
			name:   "no ResourceSlice policy, no init container, no probes",
			values: values("resourceSlicePolicy.enabled", false, "kubeletPlugin.checkDriverRoot.enabled", false, "kubeletPlugin.probes.enabled", false),
			check: func(t *testing.T, objs []Object) {
				if n := len(all[*admissionv1.ValidatingAdmissionPolicy](objs)) + len(all[*admissionv1.ValidatingAdmissionPolicyBinding](objs)); n != 0 {
					t.Errorf("%d policy objects, want none", n)
				}
				ds, c := pluginContainer(t, objs)
				if len(ds.Spec.Template.Spec.InitContainers) != 0 || c.LivenessProbe != nil || c.StartupProbe != nil || c.ReadinessProbe != nil {
					t.Error("init container or probes rendered")
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, render(t, Options{Namespace: tc.namespace, Values: tc.values}))
		})
	}
}

func hasMount(c corev1.Container, path string) bool {
	return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == path })
}

func hasVolume(ds *appsv1.DaemonSet, hostPath string) bool {
	return slices.ContainsFunc(ds.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
		return v.HostPath != nil && v.HostPath.Path == hostPath
	})
}

// checkDaemonSet checks what every kubelet plugin DaemonSet needs.
func checkDaemonSet(t *testing.T, objs []Object) {
	t.Helper()
	ds, c := pluginContainer(t, objs)
	spec := ds.Spec.Template.Spec

	// Zero-downtime upgrades: surge one pod, never go without one, and
	// tell each pod its UID so that the two register side by side.
	ru := ds.Spec.UpdateStrategy.RollingUpdate
	if ds.Spec.UpdateStrategy.Type != appsv1.RollingUpdateDaemonSetStrategyType || ru == nil ||
		ru.MaxSurge == nil || ru.MaxSurge.IntValue() != 1 || ru.MaxUnavailable == nil || ru.MaxUnavailable.IntValue() != 0 {
		t.Errorf("update strategy %+v, want RollingUpdate maxSurge 1 maxUnavailable 0", ds.Spec.UpdateStrategy)
	}
	if v, _ := flagValue(c.Args, "pod-uid"); v != "$(POD_UID)" {
		t.Errorf("--pod-uid=%q, want $(POD_UID)", v)
	}
	if v, _ := flagValue(c.Args, "node-name"); v != "$(NODE_NAME)" {
		t.Errorf("--node-name=%q, want $(NODE_NAME)", v)
	}
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if env["NODE_NAME"] != "spec.nodeName" || env["POD_UID"] != "metadata.uid" {
		t.Errorf("downward API env %v, want NODE_NAME from spec.nodeName and POD_UID from metadata.uid", env)
	}
	if spec.HostNetwork {
		t.Error("hostNetwork: the surge pod could not bind the HTTP port beside the old one")
	}

	// Mounts: the kubelet's plugin and registry directories, CDI, the
	// driver root, /sys, /proc and the MPS root, each where the flag says.
	for flag, host := range map[string]string{
		"registrar-dir":         "/var/lib/kubelet/plugins_registry",
		"cdi-dir":               "/var/run/cdi",
		"container-driver-root": "/",
		"sysfs-root":            "/sys",
		"proc-root":             "/proc",
		"mps-root":              "/run/gpudra/mps",
	} {
		path, ok := flagValue(c.Args, flag)
		if !ok {
			t.Errorf("no --%s", flag)
			continue
		}
		if !mountsHostPath(ds, c, path, host) {
			t.Errorf("--%s=%s is not the host's %s", flag, path, host)
		}
	}
	if dataDir, _ := flagValue(c.Args, "plugin-data-dir"); !strings.HasPrefix(dataDir, "/var/lib/kubelet/plugins/") || !hasMount(c, "/var/lib/kubelet/plugins") {
		t.Errorf("--plugin-data-dir=%s is not under the mounted kubelet plugins directory", dataDir)
	}

	// Probes on the HTTP endpoint the plugin serves them on.
	endpoint, _ := flagValue(c.Args, "http-endpoint")
	if len(c.Ports) != 1 || fmt.Sprintf(":%d", c.Ports[0].ContainerPort) != endpoint {
		t.Errorf("ports %+v do not match --http-endpoint=%s", c.Ports, endpoint)
	}
	for name, probe := range map[string]*corev1.Probe{"/livez": c.StartupProbe, "/livez ": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != strings.TrimSpace(name) || probe.HTTPGet.Port.String() != c.Ports[0].Name {
			t.Errorf("probe %s: %+v", name, probe)
		}
	}

	if len(spec.InitContainers) != 1 || spec.InitContainers[0].Name != "check-driver-root" {
		t.Errorf("init containers %v, want check-driver-root", spec.InitContainers)
	}
	// The image's default user is 65532; the plugin and its check need
	// root and privileges.
	for _, container := range append(slices.Clone(spec.InitContainers), c) {
		sc := container.SecurityContext
		if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 || sc.Privileged == nil || !*sc.Privileged {
			t.Errorf("container %s: securityContext %+v, want runAsUser 0 and privileged", container.Name, sc)
		}
	}
	if spec.PriorityClassName != "system-node-critical" || len(spec.Tolerations) == 0 || spec.Affinity == nil {
		t.Errorf("priority class %q, tolerations %v, affinity %v", spec.PriorityClassName, spec.Tolerations, spec.Affinity)
	}
	if spec.ServiceAccountName != rbac.KubeletPluginName {
		t.Errorf("service account %q", spec.ServiceAccountName)
	}
}

// mountsHostPath reports whether c mounts the host's hostPath at path.
func mountsHostPath(ds *appsv1.DaemonSet, c corev1.Container, path, hostPath string) bool {
	for _, m := range c.VolumeMounts {
		if m.MountPath != path {
			continue
		}
		for _, v := range ds.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.HostPath != nil && v.HostPath.Path == hostPath {
				return true
			}
		}
	}
	return false
}

func checkWebhook(t *testing.T, objs []Object, namespace string) {
	t.Helper()
	vwc := find[*admissionv1.ValidatingWebhookConfiguration](t, objs, "gpudra-webhook")
	if len(vwc.Webhooks) != 1 {
		t.Fatalf("%d webhooks, want 1", len(vwc.Webhooks))
	}
	w := vwc.Webhooks[0]
	if *w.MatchPolicy != admissionv1.Equivalent || *w.FailurePolicy != admissionv1.Fail {
		t.Errorf("matchPolicy %v failurePolicy %v", *w.MatchPolicy, *w.FailurePolicy)
	}
	if len(w.Rules) != 1 || !slices.Equal(w.Rules[0].APIGroups, []string{"resource.k8s.io"}) ||
		!slices.Equal(w.Rules[0].Resources, []string{"resourceclaims", "resourceclaimtemplates", "deviceclasses"}) ||
		!slices.Equal(w.Rules[0].Operations, []admissionv1.OperationType{admissionv1.Create, admissionv1.Update}) {
		t.Errorf("rules %+v", w.Rules)
	}
	svc := find[*corev1.Service](t, objs, "gpudra-webhook")
	if ref := w.ClientConfig.Service; ref == nil || ref.Name != svc.Name || ref.Namespace != namespace || svc.Namespace != namespace {
		t.Errorf("webhook calls %+v, Service is %s/%s", ref, svc.Namespace, svc.Name)
	}
	dep := find[*appsv1.Deployment](t, objs, "gpudra-webhook")
	if !reflect.DeepEqual(svc.Spec.Selector, dep.Spec.Selector.MatchLabels) {
		t.Errorf("Service selects %v, Deployment's pods are %v", svc.Spec.Selector, dep.Spec.Selector.MatchLabels)
	}
	args := dep.Spec.Template.Spec.Containers[0].Args
	if v, _ := flagValue(args, "webhook-configuration-name"); v != vwc.Name {
		t.Errorf("--webhook-configuration-name=%q, want %q", v, vwc.Name)
	}
	if v, _ := flagValue(args, "self-signed-hosts"); !strings.Contains(v, "gpudra-webhook."+namespace+".svc") {
		t.Errorf("--self-signed-hosts=%q lacks the Service's name", v)
	}
}

// checkNamespace checks that every namespaced object, and every reference
// to the chart's ServiceAccounts, is in namespace.
func checkNamespace(t *testing.T, objs []Object, namespace string) {
	t.Helper()
	for _, o := range objs {
		switch o.Object.(type) {
		case *resourceapi.DeviceClass, *rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding, *corev1.Namespace, *apiextensionsv1.CustomResourceDefinition,
			*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding, *admissionv1.ValidatingWebhookConfiguration:
			if o.Namespace != "" {
				t.Errorf("cluster-scoped %s has a namespace", o)
			}
		default:
			if o.Namespace != namespace {
				t.Errorf("%s, want namespace %s", o, namespace)
			}
		}
	}
	for _, b := range all[*rbacv1.ClusterRoleBinding](objs) {
		for _, s := range b.Subjects {
			if s.Namespace != namespace {
				t.Errorf("ClusterRoleBinding %s binds %s/%s", b.Name, s.Namespace, s.Name)
			}
		}
	}
	vap := find[*admissionv1.ValidatingAdmissionPolicy](t, objs, "gpudra-resourceslices-own-node")
	if want := "system:serviceaccount:" + namespace + ":" + rbac.KubeletPluginName; !strings.Contains(vap.Spec.MatchConditions[0].Expression, `"`+want+`"`) {
		t.Errorf("policy matches %q, want the user %s", vap.Spec.MatchConditions[0].Expression, want)
	}
}

// allClasses returns the DeviceClasses of deployments/deviceclasses: the
// GPU driver's, then the ComputeDomain driver's, each sorted by name as the
// chart renders them.
func allClasses(t *testing.T) []*resourceapi.DeviceClass {
	t.Helper()
	gpu, err := deviceclasses.All()
	if err != nil {
		t.Fatal(err)
	}
	cd, err := deviceclasses.ComputeDomain()
	if err != nil {
		t.Fatal(err)
	}
	return append(gpu, cd...)
}

// TestDeviceClassesOneSource checks that the chart installs exactly the
// DeviceClasses of deployments/deviceclasses, which the local cluster
// installs: the chart reads copies of those files in files/deviceclasses
// (TestChartFilesAreCopiesOfTheirSources).
func TestDeviceClassesOneSource(t *testing.T) {
	want := allClasses(t)
	got := all[*resourceapi.DeviceClass](render(t, Options{}))
	if len(got) != len(want) {
		t.Fatalf("chart has %d DeviceClasses, deployments/deviceclasses %d", len(got), len(want))
	}
	for i := range want {
		if got[i].Name != want[i].Name || !equality.Semantic.DeepEqual(got[i].Spec, want[i].Spec) {
			t.Errorf("chart's DeviceClass %s differs from deployments/deviceclasses' %s:\n got %+v\nwant %+v", got[i].Name, want[i].Name, got[i].Spec, want[i].Spec)
		}
	}
	for _, f := range loadChart(t).Files {
		if strings.HasSuffix(f.Name, ".go") {
			t.Errorf("chart carries Go file %s (.helmignore)", f.Name)
		}
	}
}
