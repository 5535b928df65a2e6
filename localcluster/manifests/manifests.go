// Package manifests reads Kubernetes YAML files and applies them in
// dependency order, as `kubectl apply -f DIR` would if it sorted.
package manifests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
)

// Object is one manifest and where it came from.
type Object struct {
	*unstructured.Unstructured
	// Source is "file:document" for messages.
	Source string
}

// Load reads every .yaml and .yml file under dir (recursively, in lexical
// order) or the single file dir names.
func Load(dir string) ([]Object, error) {
	var files []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read manifests: %w", err)
	}
	var objs []Object
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		more, err := Parse(data, f)
		if err != nil {
			return nil, err
		}
		objs = append(objs, more...)
	}
	return objs, nil
}

// Parse splits multi-document YAML into objects; empty documents are
// skipped.
func Parse(data []byte, source string) ([]Object, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []Object
	for i := 1; ; i++ {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("%s: document %d: %w", source, i, err)
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.GetKind() == "" || u.GetAPIVersion() == "" {
			return nil, fmt.Errorf("%s: document %d: apiVersion and kind are required", source, i)
		}
		objs = append(objs, Object{Unstructured: u, Source: fmt.Sprintf("%s:%d", source, i)})
	}
}

// rank orders kinds so that what others refer to exists first: namespaces,
// then classes and accounts, then claims and templates, then workloads,
// and bare pods last.
func rank(kind string) int {
	switch kind {
	case "Namespace", "CustomResourceDefinition":
		return 0
	case "DeviceClass", "ServiceAccount", "ConfigMap", "Secret", "PriorityClass", "ClusterRole", "Role":
		return 1
	case "ClusterRoleBinding", "RoleBinding":
		return 2
	case "ResourceClaimTemplate", "ResourceClaim":
		return 3
	case "Pod":
		return 5
	default:
		return 4
	}
}

// Sort orders objects for creation; objects of equal rank keep their order.
func Sort(objs []Object) {
	slices.SortStableFunc(objs, func(a, b Object) int { return rank(a.GetKind()) - rank(b.GetKind()) })
}

// Applier creates objects through the dynamic client.
type Applier struct {
	Client dynamic.Interface
	Mapper meta.RESTMapper
	// BeforeNamespaced, if set, is called with a namespace before the
	// first object in it is created (the local cluster waits there for
	// the namespace's default ServiceAccount). It is a wait, not a check:
	// when it fails the objects are still sent, and the API server's
	// answer decides whether they are refused.
	BeforeNamespaced func(ctx context.Context, namespace string) error
}

// Refusal is an object that could not be created, and why.
type Refusal struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	// Source is the object's "file:document".
	Source string `json:"source"`
	// Reason is the API server's message (or, for a kind the server does
	// not serve, discovery's).
	Reason string `json:"reason"`
}

// String names the object, where it came from and the reason.
func (r Refusal) String() string {
	name := r.Name
	if r.Namespace != "" {
		name = r.Namespace + "/" + name
	}
	return fmt.Sprintf("%s %s (%s): %s", r.Kind, name, r.Source, r.Reason)
}

// Apply sorts the objects and creates them; an object that exists already
// is left as it is. An object that cannot be created does not stop the
// others: every refused object is returned, in the order of creation,
// with the reason. The error is ctx's, when it ends before the last
// object.
func (a *Applier) Apply(ctx context.Context, objs []Object) ([]Refusal, error) {
	Sort(objs)
	waited := map[string]bool{}
	var refused []Refusal
	for _, obj := range objs {
		if err := ctx.Err(); err != nil {
			return refused, err
		}
		gvk := obj.GroupVersionKind()
		refuse := func(err error) {
			refused = append(refused, Refusal{Kind: gvk.Kind, Namespace: obj.GetNamespace(), Name: obj.GetName(), Source: obj.Source, Reason: err.Error()})
		}
		mapping, err := a.Mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			refuse(err)
			continue
		}
		var ri dynamic.ResourceInterface = a.Client.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := obj.GetNamespace()
			if ns == "" {
				ns = metav1.NamespaceDefault
				obj.SetNamespace(ns)
			}
			if !waited[ns] && a.BeforeNamespaced != nil {
				if err := a.BeforeNamespaced(ctx, ns); err != nil && ctx.Err() != nil {
					return refused, ctx.Err()
				}
			}
			waited[ns] = true
			ri = a.Client.Resource(mapping.Resource).Namespace(ns)
		}
		if _, err := ri.Create(ctx, obj.Unstructured, metav1.CreateOptions{FieldManager: "gpudra-sim"}); err != nil && !apierrors.IsAlreadyExists(err) {
			if ctx.Err() != nil {
				return refused, ctx.Err()
			}
			refuse(err)
		}
	}
	return refused, nil
}
