package apiserver

import (
	"fmt"
	"net/http"
)

// apiError is a failure the server answers with a Status object.
type apiError struct {
	code    int
	reason  string
	message string
	details map[string]any
}

func (e *apiError) status() object {
	st := object{
		"kind": "Status", "apiVersion": "v1", "metadata": object{},
		"status": "Failure", "message": e.message, "reason": e.reason, "code": e.code,
	}
	if e.details != nil {
		st["details"] = e.details
	}
	return st
}

func details(res *resource, name string) map[string]any {
	d := map[string]any{"name": name, "kind": res.name}
	if res.group != "" {
		d["group"] = res.group
	}
	return d
}

func qualified(res *resource) string {
	if res.group == "" {
		return res.name
	}
	return res.name + "." + res.group
}

func notFound(res *resource, name string) *apiError {
	return &apiError{code: http.StatusNotFound, reason: "NotFound", details: details(res, name),
		message: fmt.Sprintf("%s %q not found", qualified(res), name)}
}

func alreadyExists(res *resource, name string) *apiError {
	return &apiError{code: http.StatusConflict, reason: "AlreadyExists", details: details(res, name),
		message: fmt.Sprintf("%s %q already exists", qualified(res), name)}
}

func conflict(res *resource, name, msg string) *apiError {
	return &apiError{code: http.StatusConflict, reason: "Conflict", details: details(res, name),
		message: fmt.Sprintf("Operation cannot be fulfilled on %s %q: %s", qualified(res), name, msg)}
}

// invalid is a field error; Details.Causes name the field, as the API
// server's validation does.
func invalid(res *resource, name, field, msg string) *apiError {
	d := details(res, name)
	d["causes"] = []any{map[string]any{"reason": "FieldValueInvalid", "field": field, "message": msg}}
	return &apiError{code: http.StatusUnprocessableEntity, reason: "Invalid", details: d,
		message: fmt.Sprintf("%s %q is invalid: %s: %s", qualified(res), name, field, msg)}
}

func badRequest(msg string) *apiError {
	return &apiError{code: http.StatusBadRequest, reason: "BadRequest", message: msg}
}

func unsupported(msg string) *apiError {
	return &apiError{code: http.StatusMethodNotAllowed, reason: "MethodNotAllowed", message: msg}
}
