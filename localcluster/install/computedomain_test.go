package install

import (
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
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/deployments/crds"
)

// cdContainer returns the DaemonSet's compute-domains container, or fails.
func cdContainer(t *testing.T, objs []Object) corev1.Container {
	t.Helper()
	ds := find[*appsv1.DaemonSet](t, objs, "gpudra-kubelet-plugin")
	for _, c := range ds.Spec.Template.Spec.Containers {
		if c.Name == "compute-domains" {
			return c
		}
	}
	t.Fatal("DaemonSet has no container named compute-domains")
	return corev1.Container{}
}

func controllerContainer(t *testing.T, objs []Object) (*appsv1.Deployment, corev1.Container) {
	t.Helper()
	dep := find[*appsv1.Deployment](t, objs, "gpudra-compute-domain-controller")
	return dep, dep.Spec.Template.Spec.Containers[0]
}

// checkComputeDomains checks what the ComputeDomain driver needs of the
// chart with the driver on under driverName.
func checkComputeDomains(t *testing.T, objs []Object, driverName string) {
	t.Helper()
	for _, name := range []string{crds.ComputeDomains, crds.ComputeDomainCliques} {
		crd := find[*apiextensionsv1.CustomResourceDefinition](t, objs, name)
		if crd.Annotations["helm.sh/resource-policy"] != "keep" {
			t.Errorf("CRD %s: annotations %v, want helm.sh/resource-policy: keep (uninstall must not delete users' ComputeDomains)", name, crd.Annotations)
		}
	}
	for _, class := range []string{"compute-domain-default-channel.nvidia.com", "compute-domain-daemon.nvidia.com"} {
		c := find[*resourceapi.DeviceClass](t, objs, class)
		if expr := c.Spec.Selectors[0].CEL.Expression; !strings.Contains(expr, "device.driver == '"+driverName+"'") {
			t.Errorf("%s: selector %q does not select driver %s", class, expr, driverName)
		}
	}
	c := cdContainer(t, objs)
	if !slices.Equal(c.Command, []string{"/usr/bin/gpudra-node"}) || len(c.Args) == 0 || c.Args[0] != "compute-domain-kubelet-plugin" {
		t.Errorf("compute-domains runs %q %q", c.Command, c.Args)
	}
	for flag, want := range map[string]string{
		"driver-name":     driverName,
		"plugin-data-dir": "/var/lib/kubelet/plugins/" + driverName,
		"pod-uid":         "$(POD_UID)",
		"node-name":       "$(NODE_NAME)",
		"registrar-dir":   "/var/lib/kubelet/plugins_registry",
		"cdi-dir":         "/var/run/cdi",
		"proc-root":       "/host/proc",
		// The IMEX side: the release's namespace, the node's IP.
		"clique-namespace": "gpudra",
		"node-ip":          "$(NODE_IP)",
		"imex-hosts-file":  "/etc/hosts",
	} {
		if got, _ := flagValue(c.Args, flag); got != want {
			t.Errorf("compute-domains --%s=%q, want %q", flag, got, want)
		}
	}
	for _, path := range []string{"/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry", "/var/run/cdi", "/driver-root", "/host/proc", "/etc/hosts"} {
		if !hasMount(c, path) {
			t.Errorf("compute-domains does not mount %s", path)
		}
	}
	env := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
			env[e.Name] = e.ValueFrom.FieldRef.FieldPath
		}
	}
	if env["NODE_NAME"] != "spec.nodeName" || env["POD_UID"] != "metadata.uid" || env["NODE_IP"] != "status.hostIP" || env["POD_NAMESPACE"] != "metadata.namespace" {
		t.Errorf("compute-domains env %v, want NODE_NAME, POD_UID, NODE_IP and POD_NAMESPACE from the downward API", env)
	}
	ds := find[*appsv1.DaemonSet](t, objs, "gpudra-kubelet-plugin")
	if !slices.ContainsFunc(ds.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool {
		return v.Name == "imex-hosts" && v.HostPath != nil && v.HostPath.Path == "/etc/hosts" &&
			v.HostPath.Type != nil && *v.HostPath.Type == corev1.HostPathFileOrCreate
	}) {
		t.Errorf("the DaemonSet has no hostPath volume imex-hosts of /etc/hosts (FileOrCreate): %+v", ds.Spec.Template.Spec.Volumes)
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "cd-http" || c.LivenessProbe == nil || c.LivenessProbe.HTTPGet.Port.String() != "cd-http" {
		t.Errorf("compute-domains ports %+v, probes on its own port", c.Ports)
	}

	dep, ctrl := controllerContainer(t, objs)
	if dep.Spec.Template.Spec.ServiceAccountName != "gpudra-compute-domain-controller" {
		t.Errorf("controller runs as %q", dep.Spec.Template.Spec.ServiceAccountName)
	}
	if len(ctrl.Args) == 0 || ctrl.Args[0] != "compute-domain-controller" {
		t.Errorf("controller args %q", ctrl.Args)
	}
	if got, _ := flagValue(ctrl.Args, "channel-driver-name"); got != driverName {
		t.Errorf("controller --channel-driver-name=%q, want %q", got, driverName)
	}

	webhook := find[*appsv1.Deployment](t, objs, "gpudra-webhook")
	if got, _ := flagValue(webhook.Spec.Template.Spec.Containers[0].Args, "compute-domain-driver-name"); got != driverName {
		t.Errorf("webhook --compute-domain-driver-name=%q, want %q", got, driverName)
	}
	vap := find[*admissionv1.ValidatingAdmissionPolicy](t, objs, "gpudra-resourceslices-own-node")
	if expr := vap.Spec.Validations[2].Expression; !strings.Contains(expr, "'"+driverName+"'") {
		t.Errorf("policy checks drivers by %q, want %s among them", expr, driverName)
	}
}

// TestRenderComputeDomains renders the ComputeDomain driver's value
// combinations.
func TestRenderComputeDomains(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values map[string]any
		check  func(t *testing.T, objs []Object)
	}{
		{
			name:   "another driver name",
			values: values("computeDomains.driverName", "cd.example.com"),
			check: func(t *testing.T, objs []Object) {
				checkComputeDomains(t, objs, "cd.example.com")
				role := find[*rbacv1.ClusterRole](t, objs, "gpudra-compute-domain-kubelet-plugin")
				if !slices.ContainsFunc(role.Rules, func(r rbacv1.PolicyRule) bool {
					return slices.Equal(r.Resources, []string{"resourceclaims/driver"}) && slices.Equal(r.ResourceNames, []string{"cd.example.com"})
				}) {
					t.Errorf("channel plugin's device status rule does not name cd.example.com: %+v", role.Rules)
				}
			},
		},
		{
			name:   "off",
			values: values("computeDomains.enabled", false),
			check: func(t *testing.T, objs []Object) {
				for _, o := range objs {
					if strings.Contains(o.Name, "compute-domain") || strings.Contains(o.Name, "computedomain") {
						t.Errorf("%s rendered with computeDomains.enabled false", o)
					}
				}
				ds := find[*appsv1.DaemonSet](t, objs, "gpudra-kubelet-plugin")
				if n := len(ds.Spec.Template.Spec.Containers); n != 1 {
					t.Errorf("DaemonSet has %d containers, want the GPU plugin's alone", n)
				}
				webhook := find[*appsv1.Deployment](t, objs, "gpudra-webhook")
				if got, ok := flagValue(webhook.Spec.Template.Spec.Containers[0].Args, "compute-domain-driver-name"); !ok || got != "" {
					t.Errorf("webhook --compute-domain-driver-name=%q (set %v), want it empty: no ComputeDomain configs to validate", got, ok)
				}
				vap := find[*admissionv1.ValidatingAdmissionPolicy](t, objs, "gpudra-resourceslices-own-node")
				if expr := vap.Spec.Validations[2].Expression; expr != "variables.slice.spec.driver in ['gpu.nvidia.com']" {
					t.Errorf("policy checks drivers by %q, want the GPU driver alone", expr)
				}
			},
		},
		{
			name:   "controller without leader election",
			values: values("computeDomains.controller.leaderElection.enabled", false),
			check: func(t *testing.T, objs []Object) {
				dep, c := controllerContainer(t, objs)
				if dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
					t.Errorf("strategy %q: a controller without leader election must never overlap its successor", dep.Spec.Strategy.Type)
				}
				if v, _ := flagValue(c.Args, "leader-elect"); v != "false" {
					t.Errorf("--leader-elect=%q", v)
				}
				if _, ok := flagValue(c.Args, "leader-election-id"); ok {
					t.Error("Lease flags without leader election")
				}
				if got := roleGrants(objs, "gpudra", "gpudra-compute-domain-controller"); slices.ContainsFunc(got, func(g string) bool { return strings.Contains(g, "leases") }) {
					t.Errorf("Lease rules without leader election: %v", got)
				}
			},
		},
		{
			name:   "three controller replicas",
			values: values("computeDomains.controller.replicas", 3),
			check: func(t *testing.T, objs []Object) {
				dep, _ := controllerContainer(t, objs)
				if *dep.Spec.Replicas != 3 {
					t.Errorf("replicas %d", *dep.Spec.Replicas)
				}
			},
		},
		{
			name:   "network policies",
			values: values("networkPolicy.enabled", true),
			check: func(t *testing.T, objs []Object) {
				plugin := find[*networkingv1.NetworkPolicy](t, objs, "gpudra-kubelet-plugin")
				var ports []string
				for _, p := range plugin.Spec.Ingress[0].Ports {
					ports = append(ports, p.Port.String())
				}
				if !slices.Equal(ports, []string{"http", "cd-http"}) {
					t.Errorf("plugin ingress ports %v, want both containers'", ports)
				}
				ctrl := find[*networkingv1.NetworkPolicy](t, objs, "gpudra-compute-domain-controller")
				if len(ctrl.Spec.Ingress) != 0 || len(ctrl.Spec.Egress) != 2 {
					t.Errorf("controller policy %+v, want no ingress, egress to the API server and DNS", ctrl.Spec)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.check(t, render(t, Options{Values: tc.values}))
		})
	}
}

// TestCRDsOneSource checks that the chart installs exactly the CRDs of
// deployments/crds (which the tests there check against the Go types),
// with only the chart's labels and the keep annotation added.
func TestCRDsOneSource(t *testing.T) {
	objs := render(t, Options{})
	for _, name := range []string{crds.ComputeDomains, crds.ComputeDomainCliques} {
		data, err := crds.Read(name)
		if err != nil {
			t.Fatal(err)
		}
		want := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(data, want); err != nil {
			t.Fatal(err)
		}
		got := find[*apiextensionsv1.CustomResourceDefinition](t, objs, name)
		if !equality.Semantic.DeepEqual(got.Spec, want.Spec) {
			t.Errorf("chart's CRD %s differs from deployments/crds':\n got %+v\nwant %+v", name, got.Spec, want.Spec)
		}
		if got.Labels["app.kubernetes.io/name"] != "gpudra" {
			t.Errorf("CRD %s labels %v, want the chart's", name, got.Labels)
		}
	}
}
