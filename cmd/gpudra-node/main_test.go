package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/internal/nodecmd"
)

// TestHasTheNodeCommands: gpudra-node has the node's subcommands, no
// other, with the flags gpudra's have (cmd/gpudra's tests check those
// against the command reference).
func TestHasTheNodeCommands(t *testing.T) {
	var got, want []string
	for _, c := range newRootCommand().Commands() {
		got = append(got, c.Name())
	}
	for _, c := range nodecmd.Commands() {
		want = append(want, c.Name())
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("gpudra-node has %v, want %v", got, want)
	}
}

// TestLinksNoControlPlaneDependency keeps the process on every GPU node
// lean: packages that only the webhook, explain, fleet-view or the
// ComputeDomain controller need (cel-go and antlr, k8s.io/apiserver, the
// scheduler's allocator and component-helpers), and golang.org/x/net/trace,
// which gRPC leaves out under the build tag grpcnotrace that make build,
// make image and the Dockerfile set. x/net/trace executes html/template,
// whose reflection makes the linker keep every exported method of every
// type it keeps: without the tag, gpudra-node is 87 MB instead of 55.
func TestLinksNoControlPlaneDependency(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-tags", "grpcnotrace", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	forbidden := []string{
		"github.com/google/cel-go/",
		"github.com/antlr4-go/",
		"k8s.io/apiserver/",
		"k8s.io/component-helpers/",
		"k8s.io/dynamic-resource-allocation/structured",
		"golang.org/x/net/trace",
		"github.com/gpudra/gpudra/pkg/webhook",
		"github.com/gpudra/gpudra/pkg/explain",
		"github.com/gpudra/gpudra/pkg/fleetview",
		"github.com/gpudra/gpudra/pkg/computedomain/controller",
	}
	for _, pkg := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if pkg == strings.TrimSuffix(f, "/") || strings.HasPrefix(pkg, f) {
				t.Errorf("gpudra-node links %s", pkg)
			}
		}
	}
}
