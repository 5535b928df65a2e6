package crds

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

// crd is the part of a CustomResourceDefinition the tests read.
type crd struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		Group string `json:"group"`
		Names struct {
			Kind, ListKind, Plural, Singular string
		} `json:"names"`
		Scope    string `json:"scope"`
		Versions []struct {
			Name    string `json:"name"`
			Served  bool   `json:"served"`
			Storage bool   `json:"storage"`
			Schema  struct {
				OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
			} `json:"schema"`
		} `json:"versions"`
	} `json:"spec"`
}

func readCRD(t *testing.T, name string) crd {
	t.Helper()
	data, err := Read(name)
	if err != nil {
		t.Fatal(err)
	}
	var c crd
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return c
}

// TestCRDsMatchGoTypes walks each CRD's schema beside its Go type: every
// JSON field of the type has a property of the matching type and every
// property a field, and every required property is a field that Go always
// writes (no omitempty), so that nothing gpudra writes is pruned or
// refused.
func TestCRDsMatchGoTypes(t *testing.T) {
	tests := []struct {
		name, kind, plural string
		goType             reflect.Type
	}{
		{ComputeDomains, v1beta1.ComputeDomainKind, v1beta1.ComputeDomainResource, reflect.TypeFor[v1beta1.ComputeDomain]()},
		{ComputeDomainCliques, v1beta1.ComputeDomainCliqueKind, v1beta1.ComputeDomainCliqueResource, reflect.TypeFor[v1beta1.ComputeDomainClique]()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := readCRD(t, tc.name)
			if c.Kind != "CustomResourceDefinition" || c.Metadata.Name != tc.plural+"."+v1beta1.GroupName ||
				c.Spec.Group != v1beta1.GroupName || c.Spec.Names.Kind != tc.kind || c.Spec.Names.ListKind != tc.kind+"List" ||
				c.Spec.Names.Plural != tc.plural || c.Spec.Scope != "Namespaced" {
				t.Fatalf("CRD header %+v", c)
			}
			if len(c.Spec.Versions) != 1 || c.Spec.Versions[0].Name != v1beta1.Version || !c.Spec.Versions[0].Served || !c.Spec.Versions[0].Storage {
				t.Fatalf("versions %+v", c.Spec.Versions)
			}
			compare(t, "", c.Spec.Versions[0].Schema.OpenAPIV3Schema, tc.goType)
		})
	}
}

var timeType = reflect.TypeFor[metav1.Time]()

func compare(t *testing.T, path string, schema map[string]any, typ reflect.Type) {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	want := map[reflect.Kind]string{reflect.String: "string", reflect.Int: "integer", reflect.Int64: "integer", reflect.Int32: "integer",
		reflect.Struct: "object", reflect.Slice: "array", reflect.Bool: "boolean"}[typ.Kind()]
	if typ == timeType {
		want = "string"
	}
	if got, _ := schema["type"].(string); got != want {
		t.Errorf("%s: schema type %q, Go type %s wants %q", path, got, typ, want)
		return
	}
	switch {
	case typ == timeType:
	case typ.Kind() == reflect.Slice:
		items, _ := schema["items"].(map[string]any)
		compare(t, path+"[]", items, typ.Elem())
	case typ.Kind() == reflect.Struct:
		props, _ := schema["properties"].(map[string]any)
		fields := map[string]bool{} // JSON name -> always written
		for f := range typ.Fields() {
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			if opts == "inline" { // TypeMeta
				fields["apiVersion"], fields["kind"] = false, false
				continue
			}
			if name == "" || name == "-" {
				continue
			}
			fields[name] = !strings.Contains(opts, "omitempty")
			prop, ok := props[name].(map[string]any)
			switch {
			case !ok:
				t.Errorf("%s.%s: Go field %s has no schema property", path, name, f.Name)
			case name == "metadata":
				if prop["type"] != "object" {
					t.Errorf("%s.metadata: type %v", path, prop["type"])
				}
			default:
				compare(t, path+"."+name, prop, f.Type)
			}
		}
		for name := range props {
			if _, ok := fields[name]; !ok {
				t.Errorf("%s.%s: schema property has no Go field", path, name)
			}
		}
		required, _ := schema["required"].([]any)
		for _, r := range required {
			if !fields[r.(string)] {
				t.Errorf("%s.%s: required in the schema, but Go may leave it out (omitempty) or has no such field", path, r)
			}
		}
	}
}

// TestCRDEnums checks the enums against the Go constants.
func TestCRDEnums(t *testing.T) {
	c := readCRD(t, ComputeDomains)
	root := c.Spec.Versions[0].Schema.OpenAPIV3Schema
	enum := func(path ...string) []string {
		s := root
		for _, p := range path {
			if p == "[]" {
				s = s["items"].(map[string]any)
				continue
			}
			s = s["properties"].(map[string]any)[p].(map[string]any)
		}
		var out []string
		for _, v := range s["enum"].([]any) {
			out = append(out, v.(string))
		}
		slices.Sort(out)
		return out
	}
	readiness := []string{v1beta1.ComputeDomainStatusNotReady, v1beta1.ComputeDomainStatusReady}
	for _, tc := range []struct {
		path []string
		want []string
	}{
		{[]string{"spec", "channel", "allocationMode"}, v1beta1.ChannelAllocationModes},
		{[]string{"status", "status"}, readiness},
		{[]string{"status", "nodes", "[]", "status"}, readiness},
	} {
		if got := enum(tc.path...); !slices.Equal(got, tc.want) {
			t.Errorf("%v: enum %v, Go has %v", tc.path, got, tc.want)
		}
	}
}
