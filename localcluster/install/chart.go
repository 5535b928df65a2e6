package install

import (
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/kubernetes/scheme"
	sigsyaml "sigs.k8s.io/yaml"

	kruntime "k8s.io/apimachinery/pkg/runtime"
)

// ReleaseName is the release name renders use.
const ReleaseName = "gpudra"

// ChartDir returns the chart's directory in this repository.
func ChartDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "deployments", "helm", "gpudra")
}

// LoadChart loads the chart from dir as helm does.
func LoadChart(dir string) (*chart.Chart, error) {
	c, err := loader.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("load chart %s: %w", dir, err)
	}
	return c, nil
}

// Object is one rendered Kubernetes object, decoded.
type Object struct {
	// Template is the template file that rendered it.
	Template string
	// Object is the typed object (e.g. *appsv1.DaemonSet).
	Object kruntime.Object
	// GVK is its apiVersion and kind as the template wrote them.
	GVK schema.GroupVersionKind
	// Kind and Name (with Namespace, if any) identify it in messages.
	Kind, Namespace, Name string
}

// RenderChart renders c as helm install would and decodes each object
// strictly.
// A value that the schema refuses, a cluster outside the chart's
// kubeVersion, a template's fail, and an object with an unknown or
// mistyped field are errors. Objects come in a stable order: by template,
// then as the template wrote them.
func RenderChart(c *chart.Chart, opts Options) ([]Object, error) {
	if opts.Namespace == "" {
		opts.Namespace = "gpudra"
	}
	if opts.KubeVersion == "" {
		opts.KubeVersion = "v1.37.1"
	}
	kubeVersion, err := chartutil.ParseKubeVersion(opts.KubeVersion)
	if err != nil {
		return nil, err
	}
	if c.Metadata.KubeVersion != "" && !chartutil.IsCompatibleRange(c.Metadata.KubeVersion, kubeVersion.String()) {
		return nil, fmt.Errorf("chart requires kubeVersion: %s which is incompatible with Kubernetes %s", c.Metadata.KubeVersion, kubeVersion.String())
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = *kubeVersion
	values := opts.Values
	if values == nil {
		values = map[string]any{}
	}
	renderValues, err := chartutil.ToRenderValuesWithSchemaValidation(c, values, chartutil.ReleaseOptions{
		Name:      ReleaseName,
		Namespace: opts.Namespace,
		Revision:  1,
		IsInstall: true,
	}, caps, false)
	if err != nil {
		return nil, err
	}
	files, err := engine.Render(c, renderValues)
	if err != nil {
		return nil, err
	}

	decoder := serializer.NewCodecFactory(objectScheme, serializer.EnableStrict).UniversalDeserializer()
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	var objs []Object
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") || strings.TrimSpace(files[name]) == "" {
			continue
		}
		docs := releaseutil.SplitManifests(files[name])
		keys := make([]string, 0, len(docs))
		for k := range docs {
			keys = append(keys, k)
		}
		sort.Sort(releaseutil.BySplitManifestsOrder(keys))
		for _, k := range keys {
			doc := docs[k]
			if isEmptyYAML(doc) {
				continue
			}
			obj, gvk, err := decoder.Decode([]byte(doc), nil, nil)
			if kruntime.IsNotRegisteredError(err) {
				// A kind of an optional add-on's CRD (the Prometheus
				// Operator's): kept as it is.
				u := &unstructured.Unstructured{}
				if err = sigsyaml.Unmarshal([]byte(doc), &u.Object); err == nil {
					g := u.GroupVersionKind()
					obj, gvk = u, &g
				}
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %w\n%s", name, err, doc)
			}
			accessor, ok := obj.(interface {
				GetName() string
				GetNamespace() string
			})
			if !ok {
				return nil, fmt.Errorf("%s: %s has no object metadata", name, gvk)
			}
			objs = append(objs, Object{
				Template:  strings.TrimPrefix(name, c.Name()+"/"),
				Object:    obj,
				GVK:       *gvk,
				Kind:      gvk.Kind,
				Namespace: accessor.GetNamespace(),
				Name:      accessor.GetName(),
			})
		}
	}
	return objs, nil
}

// objectScheme knows the types the chart renders: client-go's, and the
// CustomResourceDefinitions of the ComputeDomain driver.
var objectScheme = func() *kruntime.Scheme {
	s := kruntime.NewScheme()
	for _, add := range []func(*kruntime.Scheme) error{scheme.AddToScheme, apiextensionsv1.AddToScheme} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	return s
}()

// isEmptyYAML reports whether doc holds only comments and blank lines.
func isEmptyYAML(doc string) bool {
	return !slices.ContainsFunc(strings.Split(doc, "\n"), func(line string) bool {
		line = strings.TrimSpace(line)
		return line != "" && !strings.HasPrefix(line, "#")
	})
}

// String names o for messages: Kind namespace/name.
func (o Object) String() string {
	if o.Namespace == "" {
		return o.Kind + " " + o.Name
	}
	return o.Kind + " " + o.Namespace + "/" + o.Name
}
