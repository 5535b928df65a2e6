package manifests

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseAndSort(t *testing.T) {
	objs, err := Parse([]byte(`
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ns}
---
# a comment-only document
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: t, namespace: ns}
---
apiVersion: batch/v1
kind: Job
metadata: {name: j, namespace: ns}
---
apiVersion: v1
kind: Namespace
metadata: {name: ns}
`), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	Sort(objs)
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetKind())
	}
	want := []string{"Namespace", "ResourceClaimTemplate", "Job", "Pod"}
	if !slices.Equal(kinds, want) {
		t.Errorf("order %v, want %v", kinds, want)
	}
	if objs[0].Source != "test.yaml:5" {
		t.Errorf("source %q, want test.yaml:5", objs[0].Source)
	}
}

func TestParseErrors(t *testing.T) {
	for name, doc := range map[string]string{
		"no kind":    "apiVersion: v1\nmetadata: {name: x}\n",
		"bad yaml":   "apiVersion: v1\nkind: [\n",
		"no version": "kind: Pod\nmetadata: {name: x}\n",
	} {
		if _, err := Parse([]byte(doc), name); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: error %v, want one naming the source", name, err)
		}
	}
}

// TestExamplesLoad checks that every example parses and that each
// example folder's objects live in a namespace the folder creates.
func TestExamplesLoad(t *testing.T) {
	dir := filepath.Join("..", "..", "examples")
	objs, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	created := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			created[o.GetName()] = true
		}
	}
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			continue
		}
		if !created[o.GetNamespace()] {
			t.Errorf("%s: %s %s is in namespace %q, which no example creates", o.Source, o.GetKind(), o.GetName(), o.GetNamespace())
		}
	}
	if len(created) < 10 {
		t.Errorf("%d example namespaces, want one per example (10)", len(created))
	}
}
