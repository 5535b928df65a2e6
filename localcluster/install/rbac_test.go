package install

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/gpudra/gpudra/deployments/rbac"
)

// ruleLines flattens rules into "verb group/resource[/name]" lines, each
// after prefix.
func ruleLines(prefix string, rules []rbacv1.PolicyRule) []string {
	var out []string
	for _, r := range rules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					if len(r.ResourceNames) == 0 {
						out = append(out, fmt.Sprintf("%s%s %s/%s", prefix, v, g, res))
					}
					for _, n := range r.ResourceNames {
						out = append(out, fmt.Sprintf("%s%s %s/%s/%s", prefix, v, g, res, n))
					}
				}
			}
		}
	}
	return out
}

// grants flattens the rules of every ClusterRole bound to the ServiceAccount
// namespace/name into "verb group/resource[/name]" lines, sorted.
func grants(objs []Object, namespace, name string) []string {
	roles := map[string]*rbacv1.ClusterRole{}
	for _, r := range all[*rbacv1.ClusterRole](objs) {
		roles[r.Name] = r
	}
	var out []string
	for _, b := range all[*rbacv1.ClusterRoleBinding](objs) {
		if !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == rbacv1.ServiceAccountKind && s.Namespace == namespace && s.Name == name
		}) {
			continue
		}
		role := roles[b.RoleRef.Name]
		if role == nil {
			out = append(out, "missing ClusterRole "+b.RoleRef.Name)
			continue
		}
		out = append(out, ruleLines("", role.Rules)...)
	}
	sort.Strings(out)
	return out
}

// roleGrants does the same for the Roles bound to the ServiceAccount by
// RoleBindings, each line prefixed with the Role's namespace.
func roleGrants(objs []Object, namespace, name string) []string {
	roles := map[string]*rbacv1.Role{}
	for _, r := range all[*rbacv1.Role](objs) {
		roles[r.Namespace+"/"+r.Name] = r
	}
	var out []string
	for _, b := range all[*rbacv1.RoleBinding](objs) {
		if !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == rbacv1.ServiceAccountKind && s.Namespace == namespace && s.Name == name
		}) {
			continue
		}
		role := roles[b.Namespace+"/"+b.RoleRef.Name]
		if role == nil || b.RoleRef.Kind != "Role" {
			out = append(out, "missing Role "+b.Namespace+"/"+b.RoleRef.Name)
			continue
		}
		out = append(out, ruleLines(role.Namespace+": ", role.Rules)...)
	}
	sort.Strings(out)
	return out
}

// TestRBACPerComponent lists what each component may do and compares it
// with what it needs; anything more is a failure.
func TestRBACPerComponent(t *testing.T) {
	pluginNeeds := []string{
		// The ResourceSlice controller of the kubeletplugin helper (and the
		// ResourceSlice policy narrows these to the node's own slices).
		"list resource.k8s.io/resourceslices", "watch resource.k8s.io/resourceslices",
		"create resource.k8s.io/resourceslices", "update resource.k8s.io/resourceslices", "delete resource.k8s.io/resourceslices",
		// Prepare reads claims; the sweep and adoption list them.
		"get resource.k8s.io/resourceclaims", "list resource.k8s.io/resourceclaims",
		// Device status, only on claims allocated on the plugin's node.
		"patch resource.k8s.io/resourceclaims/status",
		"associated-node:patch resource.k8s.io/resourceclaims/driver/gpu.nvidia.com",
		// The Node owns the slices; the sweep checks consumer pods and
		// PodGroups (workload claims).
		"get /nodes", "get /pods", "get scheduling.k8s.io/podgroups",
		// Events.
		"create /events", "patch /events",
	}
	sort.Strings(pluginNeeds)
	webhookNeeds := []string{
		// Self-signed: keep its CA in its own configuration's caBundle.
		"get admissionregistration.k8s.io/validatingwebhookconfigurations/gpudra-webhook",
		"update admissionregistration.k8s.io/validatingwebhookconfigurations/gpudra-webhook",
	}

	// The channel plugin, in the same pod, adds what it asks beyond the GPU
	// plugin: the domain of a channel claim, and device status for its
	// own driver.
	pluginAndChannelsNeed := append(slices.Clone(pluginNeeds),
		"list resource.nvidia.com/computedomains",
		"associated-node:patch resource.k8s.io/resourceclaims/driver/compute-domain.nvidia.com",
	)
	sort.Strings(pluginAndChannelsNeed)
	// Everything pkg/computedomain's controller calls across namespaces ...
	controllerNeeds := []string{
		// The informer, a reconcile's Get, the finalizer's JSON patch.
		"get resource.nvidia.com/computedomains", "list resource.nvidia.com/computedomains",
		"watch resource.nvidia.com/computedomains", "patch resource.nvidia.com/computedomains",
		// Channel, conditions, nodes.
		"patch resource.nvidia.com/computedomains/status",
		// The domain's claim template.
		"create resource.k8s.io/resourceclaimtemplates", "get resource.k8s.io/resourceclaimtemplates",
		"list resource.k8s.io/resourceclaimtemplates", "delete resource.k8s.io/resourceclaimtemplates",
		// A deleted domain waits for its claims.
		"list resource.k8s.io/resourceclaims",
		// The channel driver's slices: the cliques' sizes (FitsInClique).
		"list resource.k8s.io/resourceslices", "watch resource.k8s.io/resourceslices",
	}
	sort.Strings(controllerNeeds)
	// ... and in the chart's namespace: the cliques and its Lease.
	cliqueGrants := []string{
		"gpudra: delete resource.nvidia.com/computedomaincliques",
		"gpudra: list resource.nvidia.com/computedomaincliques", "gpudra: watch resource.nvidia.com/computedomaincliques",
	}
	controllerNamespaced := []string{
		"gpudra: list resource.nvidia.com/computedomaincliques", "gpudra: watch resource.nvidia.com/computedomaincliques",
		"gpudra: delete resource.nvidia.com/computedomaincliques",
		"gpudra: create coordination.k8s.io/leases",
		"gpudra: get coordination.k8s.io/leases/gpudra-compute-domain-controller",
		"gpudra: update coordination.k8s.io/leases/gpudra-compute-domain-controller",
	}
	sort.Strings(controllerNamespaced)
	// The channel plugin, in the chart's namespace, while it may run the
	// node's IMEX daemon: its entry in each domain's clique (server-side
	// apply, which creates the clique for its first node, read, JSON patch
	// to leave; a watch of its clique's objects), and the clique's IMEX
	// index ConfigMap.
	pluginNamespaced := []string{
		"gpudra: create resource.nvidia.com/computedomaincliques", "gpudra: get resource.nvidia.com/computedomaincliques", "gpudra: list resource.nvidia.com/computedomaincliques",
		"gpudra: watch resource.nvidia.com/computedomaincliques", "gpudra: patch resource.nvidia.com/computedomaincliques",
		"gpudra: get /configmaps", "gpudra: create /configmaps", "gpudra: patch /configmaps",
	}
	sort.Strings(pluginNamespaced)
	cdOff := func(kv ...any) map[string]any {
		return values(append([]any{"computeDomains.enabled", false}, kv...)...)
	}

	for _, tc := range []struct {
		name                             string
		values                           map[string]any
		plugin, webhook                  []string
		controller, controllerNamespaced []string
		pluginNamespaced                 []string
		clusterRoles, roles              int
	}{
		{"defaults", nil, pluginAndChannelsNeed, webhookNeeds, controllerNeeds, controllerNamespaced, pluginNamespaced, 4, 4},
		{"ComputeDomains off", cdOff(), pluginNeeds, webhookNeeds, nil, nil, nil, 2, 0},
		{"controller without leader election", values("computeDomains.controller.leaderElection.enabled", false), pluginAndChannelsNeed, webhookNeeds, controllerNeeds, cliqueGrants, pluginNamespaced, 4, 4},
		{"IMEX daemon off", values("computeDomains.kubeletPlugin.imex.daemon", "off"), pluginAndChannelsNeed, webhookNeeds, controllerNeeds, controllerNamespaced, nil, 4, 2},
		{"webhook with a certificate Secret", cdOff("webhook.tls.mode", "secret", "webhook.tls.secretName", "s", "webhook.tls.caBundle", "Y2E="), pluginNeeds, nil, nil, nil, nil, 1, 0},
		{"webhook off", cdOff("webhook.enabled", false), pluginNeeds, nil, nil, nil, nil, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := render(t, Options{Values: tc.values})
			if got := grants(objs, "gpudra", rbac.KubeletPluginName); !slices.Equal(got, tc.plugin) {
				t.Errorf("kubelet plugin may:\n  %s\nwants:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.plugin, "\n  "))
			}
			if got := grants(objs, "gpudra", "gpudra-webhook"); !slices.Equal(got, tc.webhook) {
				t.Errorf("webhook may:\n  %s\nwants:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.webhook, "\n  "))
			}
			if got := grants(objs, "gpudra", "gpudra-compute-domain-controller"); !slices.Equal(got, tc.controller) {
				t.Errorf("compute-domain controller may:\n  %s\nwants:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.controller, "\n  "))
			}
			if got := roleGrants(objs, "gpudra", "gpudra-compute-domain-controller"); !slices.Equal(got, tc.controllerNamespaced) {
				t.Errorf("compute-domain controller may, in its namespace:\n  %s\nwants:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.controllerNamespaced, "\n  "))
			}
			if got := roleGrants(objs, "gpudra", rbac.KubeletPluginName); !slices.Equal(got, tc.pluginNamespaced) {
				t.Errorf("kubelet plugin may, in its namespace:\n  %s\nwants:\n  %s", strings.Join(got, "\n  "), strings.Join(tc.pluginNamespaced, "\n  "))
			}
			if got := roleGrants(objs, "gpudra", "gpudra-webhook"); len(got) > 0 {
				t.Errorf("gpudra-webhook has namespaced grants %v", got)
			}
			if n := len(all[*rbacv1.ClusterRole](objs)); n != tc.clusterRoles {
				t.Errorf("%d ClusterRoles, want %d", n, tc.clusterRoles)
			}
			if n := len(all[*rbacv1.Role](objs)) + len(all[*rbacv1.RoleBinding](objs)); n != tc.roles {
				t.Errorf("%d Roles and RoleBindings, want %d", n, tc.roles)
			}
			for _, r := range all[*rbacv1.Role](objs) {
				for _, rule := range r.Rules {
					if slices.Contains(rule.Verbs, "*") || slices.Contains(rule.Resources, "*") || slices.Contains(rule.APIGroups, "*") {
						t.Errorf("Role %s has a wildcard rule %+v", r.Name, rule)
					}
				}
			}
			for _, r := range all[*rbacv1.ClusterRole](objs) {
				for _, rule := range r.Rules {
					if slices.Contains(rule.Verbs, "*") || slices.Contains(rule.Resources, "*") || slices.Contains(rule.APIGroups, "*") {
						t.Errorf("ClusterRole %s has a wildcard rule %+v", r.Name, rule)
					}
				}
			}
		})
	}

	// The plugin's role is deployments/rbac's, the one the local cluster's
	// plugins run with (and localcluster/test/rbactest checks call by call).
	t.Run("same as deployments/rbac", func(t *testing.T) {
		objs := render(t, Options{Namespace: "gpu-system"})
		want, err := rbac.KubeletPlugin("gpu-system", "")
		if err != nil {
			t.Fatal(err)
		}
		role := find[*rbacv1.ClusterRole](t, objs, rbac.KubeletPluginName)
		binding := find[*rbacv1.ClusterRoleBinding](t, objs, rbac.KubeletPluginName)
		if !equality.Semantic.DeepEqual(role.Rules, want.ClusterRole.Rules) {
			t.Errorf("ClusterRole rules differ from deployments/rbac:\n got %+v\nwant %+v", role.Rules, want.ClusterRole.Rules)
		}
		if !equality.Semantic.DeepEqual(binding.Subjects, want.ClusterRoleBinding.Subjects) || binding.RoleRef != want.ClusterRoleBinding.RoleRef {
			t.Errorf("binding %+v -> %+v, want %+v -> %+v", binding.Subjects, binding.RoleRef, want.ClusterRoleBinding.Subjects, want.ClusterRoleBinding.RoleRef)
		}
	})
}
