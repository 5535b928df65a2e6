package strictjson

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
)

// Type is the type of a JSON value, as error messages name it.
type Type string

const (
	Object  Type = "object"
	Array   Type = "array"
	String  Type = "string"
	Number  Type = "number"
	Boolean Type = "boolean"
	Null    Type = "null"
)

// KindOf returns the type of the valid JSON value raw.
func KindOf(raw []byte) Type {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return Null
	}
	switch raw[0] {
	case '{':
		return Object
	case '[':
		return Array
	case '"':
		return String
	case 't', 'f':
		return Boolean
	case 'n':
		return Null
	}
	return Number
}

// Describe names the type of raw for an error message, with the value for
// numbers as encoding/json does ("number 1.5").
func Describe(raw []byte) string {
	kind := KindOf(raw)
	if kind == Number {
		return fmt.Sprintf("%s %s", kind, abbreviate(raw))
	}
	return string(kind)
}

// expected names the JSON form a Go type decodes from.
func expected(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return string(Object)
	case reflect.Slice, reflect.Array:
		return string(Array)
	case reflect.Bool:
		return string(Boolean)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "int"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "non-negative int"
	case reflect.Float32, reflect.Float64:
		return string(Number)
	}
	return t.Kind().String()
}

// abbreviate cuts raw to a length that fits an error message.
func abbreviate(raw []byte) string {
	const limit = 64
	raw = bytes.TrimSpace(raw)
	if len(raw) <= limit {
		return string(raw)
	}
	return string(raw[:limit]) + "..."
}

// Member is one name/value pair of a JSON object. Unlike a map, a list of
// Members keeps repeated names, so that duplicates can be reported.
type Member struct {
	Name  string
	Value json.RawMessage
}

// Members returns the members of the valid JSON object raw, in order.
func Members(raw []byte) ([]Member, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // the opening brace
		return nil, err
	}
	var ms []Member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		name, _ := tok.(string)
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return nil, err
		}
		ms = append(ms, Member{Name: name, Value: value})
	}
	return ms, nil
}
