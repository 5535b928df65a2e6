package v1beta1_test

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

// TestReferenceDocumentsEveryConfigField keeps docs/reference/config-api.md
// in step with the opaque config types: every kind is named there, and
// every JSON field of every kind, by its path or, in the tables of a
// nested object (mpsConfig), by its name.
func TestReferenceDocumentsEveryConfigField(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/reference/config-api.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	kinds := map[string]any{
		"GpuConfig":                  v1beta1.GpuConfig{},
		"MigDeviceConfig":            v1beta1.MigDeviceConfig{},
		"VfioDeviceConfig":           v1beta1.VfioDeviceConfig{},
		"ComputeDomainChannelConfig": v1beta1.ComputeDomainChannelConfig{},
		"ComputeDomainDaemonConfig":  v1beta1.ComputeDomainDaemonConfig{},
	}
	fields := 0
	for kind, v := range kinds {
		if !strings.Contains(text, "`"+kind+"`") {
			t.Errorf("docs/reference/config-api.md does not name the kind %s", kind)
		}
		walk(reflect.TypeOf(v), "", func(path, name string) {
			fields++
			if !strings.Contains(text, "`"+path+"`") && !strings.Contains(text, "`"+name+"`") && !strings.Contains(text, "."+name+"`") {
				t.Errorf("docs/reference/config-api.md does not document %s field %s", kind, path)
			}
		})
	}
	if fields < 15 {
		t.Errorf("only %d config fields found: the check checks little", fields)
	}
}

// walk calls f with the JSON path and name of every field of t, nested
// structs included; the inlined TypeMeta (apiVersion, kind) is left out.
func walk(t reflect.Type, prefix string, f func(path, name string)) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return
	}
	for i := range t.NumField() {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if sf.Anonymous || name == "" || name == "-" || !sf.IsExported() {
			continue
		}
		path := prefix + name
		f(path, name)
		if ft := sf.Type; ft.PkgPath() != "k8s.io/apimachinery/pkg/api/resource" {
			walk(ft, path+".", f)
		}
	}
}
