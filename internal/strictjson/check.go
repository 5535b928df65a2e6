// Package strictjson checks a JSON document against the Go type it decodes
// into and reports every problem with its field path: unknown and
// duplicate fields, wrong types, and errors of custom unmarshalers such as
// resource.Quantity's, all at once. The opaque config APIs (and the
// webhook that validates them) decode through it, so a user fixing a
// config sees every mistake in one message.
package strictjson

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// checker walks a JSON document alongside the Go type it decodes into and
// collects every problem with its field path. The JSON decoder stops at the
// first wrong type, drops the path of errors from custom unmarshalers such as
// resource.Quantity's, and loses its unknown-field errors once it has a type
// error; a user fixing a config deserves all of them at once.
type checker struct {
	// strict reports unknown and duplicate fields.
	strict bool
	errs   []error
}

var (
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	quantityType    = reflect.TypeFor[resource.Quantity]()
)

// Check checks raw against the type of obj (a pointer to a struct) and
// returns every problem, each naming its field path. strict also reports
// unknown and duplicate fields.
func Check(raw json.RawMessage, obj runtime.Object, strict bool) []error {
	c := checker{strict: strict}
	c.check(raw, reflect.TypeOf(obj).Elem(), nil)
	return c.errs
}

func (c *checker) check(raw json.RawMessage, t reflect.Type, path *field.Path) {
	kind := KindOf(raw)
	if kind == Null {
		return // null leaves any Go value as it is.
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		err := reflect.New(t).Interface().(json.Unmarshaler).UnmarshalJSON(raw)
		switch {
		case err == nil:
		case t == quantityType:
			// The parser's own message is a regular expression.
			c.errs = append(c.errs, fmt.Errorf(`%s: invalid quantity %s: expected a number with an optional suffix, such as "512Mi" or "2Gi"`, path, abbreviate(raw)))
		default:
			c.errs = append(c.errs, fmt.Errorf("%s: invalid value %s: %w", path, abbreviate(raw), err))
		}
		return
	}
	switch t.Kind() {
	case reflect.Pointer:
		c.check(raw, t.Elem(), path)
	case reflect.Struct:
		if c.expect(kind == Object, raw, t, path) {
			c.checkStruct(raw, t, path)
		}
	case reflect.Map:
		if c.expect(kind == Object && t.Key().Kind() == reflect.String, raw, t, path) {
			keyPath := func(name string) *field.Path { return path.Key(name) }
			c.checkMembers(raw, path, keyPath, func(name string, value json.RawMessage) {
				c.check(value, t.Elem(), path.Key(name))
			})
		}
	case reflect.Slice:
		var items []json.RawMessage
		if c.expect(kind == Array && json.Unmarshal(raw, &items) == nil, raw, t, path) {
			for i, item := range items {
				c.check(item, t.Elem(), path.Index(i))
			}
		}
	case reflect.String:
		c.expect(kind == String, raw, t, path)
	case reflect.Bool:
		c.expect(kind == Boolean, raw, t, path)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		_, err := strconv.ParseInt(string(raw), 10, t.Bits())
		c.expect(kind == Number && err == nil, raw, t, path)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		_, err := strconv.ParseUint(string(raw), 10, t.Bits())
		c.expect(kind == Number && err == nil, raw, t, path)
	case reflect.Float32, reflect.Float64:
		_, err := strconv.ParseFloat(string(raw), t.Bits())
		c.expect(kind == Number && err == nil, raw, t, path)
	}
}

// expect records a type error unless ok, and returns ok.
func (c *checker) expect(ok bool, raw json.RawMessage, t reflect.Type, path *field.Path) bool {
	if !ok {
		c.errs = append(c.errs, fmt.Errorf("%s: expected %s, got %s", path, expected(t), Describe(raw)))
	}
	return ok
}

func (c *checker) checkStruct(raw json.RawMessage, t reflect.Type, path *field.Path) {
	fields := jsonFields(t)
	fieldPath := func(name string) *field.Path { return child(path, name) }
	c.checkMembers(raw, path, fieldPath, func(name string, value json.RawMessage) {
		ft, known := fields[name]
		switch {
		case known:
			c.check(value, ft, child(path, name))
		case c.strict:
			c.errs = append(c.errs, fmt.Errorf("unknown field %q", child(path, name).String()))
		}
	})
}

// checkMembers calls each for every member of the object raw, reporting the
// repeats of a name as duplicates instead when strict; pathOf gives the path
// of a member.
func (c *checker) checkMembers(raw json.RawMessage, path *field.Path, pathOf func(string) *field.Path, each func(name string, value json.RawMessage)) {
	ms, err := Members(raw)
	if err != nil {
		c.errs = append(c.errs, fmt.Errorf("%s: %w", path, err))
		return
	}
	seen := make(map[string]bool, len(ms))
	for _, m := range ms {
		if seen[m.Name] && c.strict {
			c.errs = append(c.errs, fmt.Errorf("duplicate field %q", pathOf(m.Name).String()))
			continue
		}
		seen[m.Name] = true
		each(m.Name, m.Value)
	}
}

// jsonFields maps the JSON names of t's fields, including those of embedded
// structs without a name (metav1.TypeMeta), to their types. Only the tag
// forms this package uses are understood.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	fields := make(map[string]reflect.Type, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || !f.IsExported() && !f.Anonymous:
		case name == "" && f.Anonymous && f.Type.Kind() == reflect.Struct:
			for n, ft := range jsonFields(f.Type) {
				if _, shadowed := fields[n]; !shadowed {
					fields[n] = ft
				}
			}
		case name == "":
			fields[f.Name] = f.Type
		default:
			fields[name] = f.Type
		}
	}
	return fields
}

func child(path *field.Path, name string) *field.Path {
	if path == nil {
		return field.NewPath(name)
	}
	return path.Child(name)
}
