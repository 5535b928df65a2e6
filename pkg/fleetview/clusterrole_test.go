package fleetview

import (
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// TestClusterRoleGrantsWhatTheViewReads: the shipped ClusterRole grants
// list and watch on every resource the view reads, and nothing else.
func TestClusterRoleGrantsWhatTheViewReads(t *testing.T) {
	data, err := os.ReadFile("../../deployments/fleetview/clusterrole.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(data, &role); err != nil {
		t.Fatal(err)
	}
	granted := map[string]bool{}
	for _, r := range role.Rules {
		if !slices.Equal(r.Verbs, []string{"list", "watch"}) || len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
			t.Errorf("rule %+v: want list and watch only", r)
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				name := res
				if g != "" {
					name += "." + g
				}
				granted[name] = true
			}
		}
	}
	for _, res := range Resources {
		if !granted[res] {
			t.Errorf("the ClusterRole does not grant list and watch on %s", res)
		}
		delete(granted, res)
	}
	if len(granted) > 0 {
		t.Errorf("the ClusterRole grants more than the view reads: %v", strings.Join(slices.Sorted(maps.Keys(granted)), ", "))
	}
}
