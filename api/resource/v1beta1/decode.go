package v1beta1

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/runtime"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"

	"github.com/gpudra/gpudra/internal/strictjson"
)

// Decode decodes one opaque parameters document, as found in
// OpaqueDeviceConfiguration.Parameters, into a new object of its kind
// (*GpuConfig, *MigDeviceConfig or *VfioDeviceConfig). It neither
// normalizes nor validates.
//
// Decoding is strict and reports every problem it finds, each naming its
// field path: unknown fields (`unknown field "sharing.timeSlicingConfig.intervall"`),
// duplicate fields, values of the wrong JSON type
// (`sharing.mpsConfig.defaultActiveThreadPercentage: expected int, got string`),
// values a field rejects (quantities), and a missing or unsupported
// apiVersion or kind, listing the supported kinds. Field names are
// case-sensitive. The input is JSON, the form the API server stores
// parameters in.
//
// Decode accepts exactly the documents that the API machinery's strict JSON
// serializer, which the NVIDIA driver decodes with, accepts, and decodes them
// to the same objects (FuzzDecodeMatchesAPIMachinery); it differs in saying
// more about the documents it rejects.
func Decode(raw []byte) (runtime.Object, error) {
	return decode(raw, true)
}

// DecodeLenient decodes like Decode but ignores unknown and duplicate fields.
// It exists for documents gpudra wrote itself, such as configs stored in a
// checkpoint by a newer version before a downgrade; user input must go
// through Decode.
func DecodeLenient(raw []byte) (runtime.Object, error) {
	return decode(raw, false)
}

func decode(raw []byte, strict bool) (runtime.Object, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, errors.New("no parameters: expected a JSON object with apiVersion and kind")
	}
	if !json.Valid(raw) {
		var syntax any
		err := json.Unmarshal(raw, &syntax)
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("invalid JSON at offset %d: %w", se.Offset, err)
		}
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if kind := strictjson.KindOf(raw); kind != strictjson.Object {
		return nil, fmt.Errorf("expected a JSON object with apiVersion and kind, got %s", strictjson.Describe(raw))
	}
	top, err := strictjson.Members(raw)
	if err != nil {
		return nil, err
	}
	obj, errs := newObject(top)
	if len(errs) > 0 {
		return nil, utilerrors.NewAggregate(errs)
	}

	if errs := strictjson.Check(raw, obj, strict); len(errs) > 0 {
		return nil, utilerrors.NewAggregate(errs)
	}

	// The checker follows the decoder's rules, so this should not fail; the
	// decoding proper is left to the API machinery's JSON decoder, and its
	// error is reported as is should the two ever disagree.
	if strict {
		strictErrs, err := kjson.UnmarshalStrict(raw, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
		if err == nil && len(strictErrs) > 0 {
			err = utilerrors.NewAggregate(strictErrs)
		}
		if err != nil {
			return nil, &decoderError{err: err}
		}
		return obj, nil
	}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(raw, obj); err != nil {
		return nil, &decoderError{err: err}
	}
	return obj, nil
}

// decoderError is an error the checker missed and the JSON decoder found;
// the fuzz tests look for it.
// +k8s:deepcopy-gen=false
type decoderError struct{ err error }

// Error implements error.
func (e *decoderError) Error() string { return e.err.Error() }

// Unwrap returns the decoder's error.
func (e *decoderError) Unwrap() error { return e.err }

// newObject returns an empty object of the kind top names, or errors that
// say what apiVersion and kind are supported.
func newObject(top []strictjson.Member) (runtime.Object, []error) {
	var errs []error
	apiVersion, err := stringMember(top, "apiVersion")
	if err != nil {
		errs = append(errs, err)
	}
	kind, err := stringMember(top, "kind")
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return nil, errs
	}

	gv := SchemeGroupVersion.String()
	apiVersionPath := field.NewPath("apiVersion")
	switch {
	case apiVersion == "":
		errs = append(errs, field.Required(apiVersionPath, fmt.Sprintf("must be %q", gv)))
	case apiVersion != gv:
		errs = append(errs, field.NotSupported(apiVersionPath, apiVersion, []string{gv}))
	}
	kinds := Kinds()
	kindsDetail := fmt.Sprintf("supported kinds in %s: %s", gv, quoted(kinds))
	switch {
	case kind == "":
		errs = append(errs, field.Required(field.NewPath("kind"), kindsDetail))
	case !slices.Contains(kinds, kind):
		errs = append(errs, &field.Error{Type: field.ErrorTypeNotSupported, Field: "kind", BadValue: kind, Detail: kindsDetail})
	}
	if len(errs) > 0 {
		return nil, errs
	}
	obj, err := scheme.New(SchemeGroupVersion.WithKind(kind))
	if err != nil {
		return nil, []error{err} // Kinds lists only registered kinds.
	}
	return obj, nil
}

// stringMember returns the value of the last member called name (the one
// decoding keeps), "" when there is none or it is null.
func stringMember(ms []strictjson.Member, name string) (string, error) {
	var value string
	for _, m := range ms {
		if m.Name != name {
			continue
		}
		switch strictjson.KindOf(m.Value) {
		case strictjson.Null:
			value = ""
		case strictjson.String:
			if err := json.Unmarshal(m.Value, &value); err != nil {
				return "", fmt.Errorf("%s: %w", name, err)
			}
		default:
			return "", fmt.Errorf("%s: expected string, got %s", name, strictjson.Describe(m.Value))
		}
	}
	return value, nil
}
