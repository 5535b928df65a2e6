package main

import (
	"context"
	"strings"
	"testing"
)

// TestPrepareRealNodesRefuses checks the --real-nodes values refused
// before anything is built or checked: none asks for nothing.
func TestPrepareRealNodesRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    options
		want string
	}{
		{"none", options{fleet: "demo"}, ""},
		{"two", options{fleet: "demo", realNodes: 2}, "0 or 1"},
		{"negative", options{fleet: "demo", realNodes: -1}, "0 or 1"},
		{"fleet file", options{fleet: "fleet.yaml", realNodes: 1}, "built-in fleet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rn, err := prepareRealNodes(context.Background(), tc.o, func(string, ...any) {})
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("error %v, want one naming %q", err, tc.want)
			}
			if rn != nil {
				t.Errorf("real nodes %+v, want none", rn)
			}
		})
	}
}
