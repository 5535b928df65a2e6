// Package explain says why a pending pod's or claim's devices cannot be
// allocated. It runs the scheduler's own allocator
// (k8s.io/dynamic-resource-allocation/structured, with the feature set
// Kubernetes 1.37 enables by default) against the cluster's
// ResourceSlices, counting the devices other claims hold, and when that
// finds no node, takes the claims apart: each request (and each
// subrequest of a firstAvailable list) is tried alone, its DeviceClass and
// selectors are evaluated clause by clause with the same CEL library, and
// the report names the request that fails, why (too few devices on any one
// node, a selector nothing passes, capacity, devices in use, a constraint),
// and the nearest device when a selector matches nothing.
//
// It only reads: get and list of pods, resourceclaims, events (optional),
// resourceclaimtemplates, resourceslices, deviceclasses and nodes, and get
// of a pod's PodGroup (optional: the claim a PodGroup holds for its pods).
package explain

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/client-go/kubernetes"
)

// Kind is the kind of object explained.
type Kind string

// The kinds explain accepts.
const (
	KindPod   Kind = "pod"
	KindClaim Kind = "resourceclaim"
)

// Target names the object to explain.
type Target struct {
	Kind      Kind
	Namespace string
	Name      string
}

func (t Target) String() string { return fmt.Sprintf("%s %s/%s", t.Kind, t.Namespace, t.Name) }

// ParseTarget reads kubectl's TYPE/NAME form: pod/NAME, resourceclaim/NAME
// (and their plural and short forms), or a bare NAME, which is a pod.
func ParseTarget(arg string) (Kind, string, error) {
	kind, name, found := strings.Cut(arg, "/")
	if !found {
		kind, name = string(KindPod), arg
	}
	if name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%q: want pod/NAME, resourceclaim/NAME or a pod's NAME", arg)
	}
	switch strings.ToLower(kind) {
	case "pod", "pods", "po":
		return KindPod, name, nil
	case "resourceclaim", "resourceclaims", "claim":
		return KindClaim, name, nil
	}
	return "", "", fmt.Errorf("%q: unknown kind %q: want pod or resourceclaim", arg, kind)
}

// Explain reads what the target needs from the API server, with get and
// list only, and explains whether and where its claims can be allocated.
func Explain(ctx context.Context, client kubernetes.Interface, target Target) (*Report, error) {
	in, err := Load(ctx, client, target)
	if err != nil {
		return nil, err
	}
	return Analyze(ctx, in)
}
