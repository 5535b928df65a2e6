package rbac

import (
	"io/fs"
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
)

// allows reports whether rules grant verb on group/resource (and name, if
// the rule restricts names).
func allows(rules []rbacv1.PolicyRule, group, resource, name, verb string) bool {
	for _, r := range rules {
		if slices.Contains(r.APIGroups, group) && slices.Contains(r.Resources, resource) && slices.Contains(r.Verbs, verb) &&
			(len(r.ResourceNames) == 0 || slices.Contains(r.ResourceNames, name)) {
			return true
		}
	}
	return false
}

func TestKubeletPlugin(t *testing.T) {
	for _, tc := range []struct {
		namespace, driver         string
		wantNamespace, wantDriver string
	}{
		{"", "", DefaultNamespace, DefaultDriverName},
		{"gpu-system", "gpu.example.com", "gpu-system", "gpu.example.com"},
	} {
		t.Run(tc.wantNamespace+"/"+tc.wantDriver, func(t *testing.T) {
			objs, err := KubeletPlugin(tc.namespace, tc.driver)
			if err != nil {
				t.Fatal(err)
			}
			sa, role, binding := objs.ServiceAccount, objs.ClusterRole, objs.ClusterRoleBinding
			if sa.Name != KubeletPluginName || sa.Namespace != tc.wantNamespace {
				t.Errorf("ServiceAccount %s/%s, want %s/%s", sa.Namespace, sa.Name, tc.wantNamespace, KubeletPluginName)
			}
			if role.Name != KubeletPluginName || binding.Name != KubeletPluginName || binding.RoleRef.Name != role.Name {
				t.Errorf("names: role %q, binding %q -> %q", role.Name, binding.Name, binding.RoleRef.Name)
			}
			if s := binding.Subjects[0]; s.Namespace != tc.wantNamespace || s.Name != sa.Name {
				t.Errorf("binding subject %s/%s", s.Namespace, s.Name)
			}

			// Each call the plugin makes, by who makes it.
			for _, want := range []struct{ group, resource, name, verb string }{
				{"resource.k8s.io", "resourceslices", "", "list"},
				{"resource.k8s.io", "resourceslices", "", "watch"},
				{"resource.k8s.io", "resourceslices", "", "create"},
				{"resource.k8s.io", "resourceslices", "", "update"},
				{"resource.k8s.io", "resourceslices", "", "delete"},
				{"resource.k8s.io", "resourceclaims", "", "get"},
				{"resource.k8s.io", "resourceclaims", "", "list"},
				{"resource.k8s.io", "resourceclaims/status", "", "patch"},
				{"resource.k8s.io", "resourceclaims/driver", tc.wantDriver, "associated-node:patch"},
				{"", "nodes", "", "get"},
				{"", "pods", "", "get"},
				{"scheduling.k8s.io", "podgroups", "", "get"},
				{"", "events", "", "create"},
				{"", "events", "", "patch"},
			} {
				if !allows(role.Rules, want.group, want.resource, want.name, want.verb) {
					t.Errorf("ClusterRole does not allow %s on %s/%s %q", want.verb, want.group, want.resource, want.name)
				}
			}
			// What it must not grant: another driver's status, status
			// from any node, claims' allocation, writes to claims.
			for _, deny := range []struct{ group, resource, name, verb string }{
				{"resource.k8s.io", "resourceclaims/driver", "other.example.com", "associated-node:patch"},
				{"resource.k8s.io", "resourceclaims/driver", tc.wantDriver, "arbitrary-node:patch"},
				{"resource.k8s.io", "resourceclaims/binding", "", "patch"},
				{"resource.k8s.io", "resourceclaims", "", "update"},
				{"resource.k8s.io", "resourceclaims/status", "", "update"},
				{"", "pods", "", "list"},
				{"", "secrets", "", "get"},
			} {
				if allows(role.Rules, deny.group, deny.resource, deny.name, deny.verb) {
					t.Errorf("ClusterRole allows %s on %s/%s %q", deny.verb, deny.group, deny.resource, deny.name)
				}
			}
		})
	}
}

// TestKubeletPluginFreshCopies checks that callers cannot change each
// other's objects.
func TestKubeletPluginFreshCopies(t *testing.T) {
	a, err := KubeletPlugin("", "")
	if err != nil {
		t.Fatal(err)
	}
	a.ClusterRole.Rules[0].Verbs[0] = "changed"
	b, err := KubeletPlugin("", "")
	if err != nil {
		t.Fatal(err)
	}
	if b.ClusterRole.Rules[0].Verbs[0] == "changed" {
		t.Error("second call saw the first caller's change")
	}
}

func TestFiles(t *testing.T) {
	names, err := fs.Glob(Files(), "*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{clusterRoleFile, clusterRoleBindingFile, serviceAccountFile}
	if !slices.Equal(names, want) {
		t.Errorf("files %v, want %v", names, want)
	}
}
