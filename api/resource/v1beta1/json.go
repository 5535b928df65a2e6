package v1beta1

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
)

// jsonType is the type of a JSON value, as error messages name it.
type jsonType string

const (
	jsonObject  jsonType = "object"
	jsonArray   jsonType = "array"
	jsonString  jsonType = "string"
	jsonNumber  jsonType = "number"
	jsonBoolean jsonType = "boolean"
	jsonNull    jsonType = "null"
)

// jsonKind returns the type of the valid JSON value raw.
func jsonKind(raw []byte) jsonType {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return jsonNull
	}
	switch raw[0] {
	case '{':
		return jsonObject
	case '[':
		return jsonArray
	case '"':
		return jsonString
	case 't', 'f':
		return jsonBoolean
	case 'n':
		return jsonNull
	}
	return jsonNumber
}

// describe names the type of raw for an error message, with the value for
// numbers as encoding/json does ("number 1.5").
func describe(raw []byte) string {
	kind := jsonKind(raw)
	if kind == jsonNumber {
		return fmt.Sprintf("%s %s", kind, abbreviate(raw))
	}
	return string(kind)
}

// expected names the JSON form a Go type decodes from.
func expected(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct, reflect.Map:
		return string(jsonObject)
	case reflect.Slice, reflect.Array:
		return string(jsonArray)
	case reflect.Bool:
		return string(jsonBoolean)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "int"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "non-negative int"
	case reflect.Float32, reflect.Float64:
		return string(jsonNumber)
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

// member is one name/value pair of a JSON object. Unlike a map, a list of
// members keeps repeated names, so that duplicates can be reported.
type member struct {
	name  string
	value json.RawMessage
}

// members returns the members of the valid JSON object raw, in order.
func members(raw []byte) ([]member, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // the opening brace
		return nil, err
	}
	var ms []member
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
		ms = append(ms, member{name: name, value: value})
	}
	return ms, nil
}
