package explain

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/gpudra/gpudra/pkg/preparer"
)

// Input is everything an explanation reads from the cluster.
type Input struct {
	Target Target
	// Pod is the pod explained; nil for a claim.
	Pod *corev1.Pod
	// Claims are the target's claims, in the pod's order.
	Claims []Claim
	// Classes, Slices, AllClaims and Nodes are the cluster's. AllClaims
	// tell which devices are in use. Nodes may be nil when they could not
	// be listed; the nodes the slices name are used then.
	Classes   []*resourceapi.DeviceClass
	Slices    []*resourceapi.ResourceSlice
	AllClaims []*resourceapi.ResourceClaim
	Nodes     []*corev1.Node
	// Warnings are problems met while loading that do not stop the
	// explanation.
	Warnings []string
	// Notices are what the nodes' kubelet plugins left out of or changed
	// in their publications, as their Node events say.
	Notices []NodeNotice
}

// NodeNotice is a kubelet plugin's Node event saying why a GPU or some of
// its devices (MIG placements) are not offered.
type NodeNotice struct {
	Node    string `json:"node"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// NoticeReasons are the reasons of the Normal Node events in which gpudra's
// kubelet plugin says what its publication leaves out or changes (see
// pkg/features/dynamicmig); every Warning Node event of the plugin
// (preparer.EventComponent) is a notice too: a fallback where the API
// server lacks a feature, GPUs left out or withdrawn, a lost checkpoint.
var NoticeReasons = []string{"MIGOwnershipUnknown", "MIGDevicesUnreadable"}

// isNotice reports whether a Node event says what a node's kubelet plugin
// leaves out or changes.
func isNotice(e *corev1.Event) bool {
	if e.InvolvedObject.Kind != "Node" {
		return false
	}
	return slices.Contains(NoticeReasons, e.Reason) ||
		e.Source.Component == preparer.EventComponent && e.Type == corev1.EventTypeWarning
}

// Claim is one claim of the target.
type Claim struct {
	// PodClaim is the pod's name for it (spec.resourceClaims[].name).
	PodClaim string
	// Template is the ResourceClaimTemplate it comes from, if any.
	Template string
	// Created is false when the claim does not exist yet: Claim is then
	// built from the template, as the resource claim controller would.
	Created bool
	Claim   *resourceapi.ResourceClaim
}

// Load reads the target, its claims and the cluster's devices, with get
// and list only.
func Load(ctx context.Context, client kubernetes.Interface, target Target) (*Input, error) {
	in := &Input{Target: target}
	switch target.Kind {
	case KindPod:
		pod, err := client.CoreV1().Pods(target.Namespace).Get(ctx, target.Name, metav1.GetOptions{})
		if err != nil {
			return nil, notFound(err, "pod %s/%s", target.Namespace, target.Name)
		}
		in.Pod = pod
		if in.Claims, err = podClaims(ctx, client, pod); err != nil {
			return nil, err
		}
	case KindClaim:
		claim, err := client.ResourceV1().ResourceClaims(target.Namespace).Get(ctx, target.Name, metav1.GetOptions{})
		if err != nil {
			return nil, notFound(err, "ResourceClaim %s/%s", target.Namespace, target.Name)
		}
		in.Claims = []Claim{{Created: true, Claim: claim}}
	default:
		return nil, fmt.Errorf("unknown kind %q: want %s or %s", target.Kind, KindPod, KindClaim)
	}

	classes, err := client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list DeviceClasses: %w", err)
	}
	for i := range classes.Items {
		in.Classes = append(in.Classes, &classes.Items[i])
	}
	slices, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	if len(slices.Items) == 0 {
		return nil, errors.New("no ResourceSlices in the cluster: no DRA driver has published devices (is gpudra's kubelet plugin running on the GPU nodes?)")
	}
	for i := range slices.Items {
		in.Slices = append(in.Slices, &slices.Items[i])
	}
	claims, err := client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if apierrors.IsForbidden(err) {
		// Someone allowed to read their own namespace only still gets
		// an answer, with what they cannot see said.
		in.Warnings = append(in.Warnings, fmt.Sprintf("ResourceClaims of all namespaces cannot be listed (forbidden): devices that claims outside %s hold are counted as free", target.Namespace))
		claims, err = client.ResourceV1().ResourceClaims(target.Namespace).List(ctx, metav1.ListOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("list ResourceClaims (to see which devices are in use): %w", err)
	}
	for i := range claims.Items {
		in.AllClaims = append(in.AllClaims, &claims.Items[i])
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsForbidden(err):
		in.Warnings = append(in.Warnings, "nodes cannot be listed (forbidden): node labels, taints and the pod's node affinity are not checked; the nodes the ResourceSlices name are tried")
	case err != nil:
		return nil, fmt.Errorf("list Nodes: %w", err)
	default:
		for i := range nodes.Items {
			in.Nodes = append(in.Nodes, &nodes.Items[i])
		}
	}
	in.Notices, in.Warnings = nodeNotices(ctx, client, in.Warnings)
	return in, nil
}

// nodeNotices returns the latest Node event of each node and notice
// reason. Events are optional: when they cannot be listed, a warning says
// so.
func nodeNotices(ctx context.Context, client kubernetes.Interface, warnings []string) ([]NodeNotice, []string) {
	events, err := client.CoreV1().Events(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Node"})
	if err != nil {
		return nil, append(warnings, fmt.Sprintf("Node events cannot be listed (%v): why a node's kubelet plugin offers fewer devices (MIG layouts it did not create, features the API server lacks) is not shown", err))
	}
	type key struct{ node, reason string }
	latest := map[key]*corev1.Event{}
	for i := range events.Items {
		e := &events.Items[i]
		if !isNotice(e) {
			continue
		}
		k := key{e.InvolvedObject.Name, e.Reason}
		if prev := latest[k]; prev == nil || eventTime(prev).Before(eventTime(e)) {
			latest[k] = e
		}
	}
	var out []NodeNotice
	for k, e := range latest {
		out = append(out, NodeNotice{Node: k.node, Reason: k.reason, Message: e.Message})
	}
	slices.SortFunc(out, func(a, b NodeNotice) int { return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Reason, b.Reason)) })
	return out, warnings
}

func eventTime(e *corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// podClaims returns the pod's claims: those created, and for templates
// whose claim is not created yet, one built from the template.
func podClaims(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod) ([]Claim, error) {
	if len(pod.Spec.ResourceClaims) == 0 {
		return nil, fmt.Errorf("pod %s/%s has no resource claims (spec.resourceClaims is empty): it asks for no DRA devices", pod.Namespace, pod.Name)
	}
	var out []Claim
	for i := range pod.Spec.ResourceClaims {
		pc := &pod.Spec.ResourceClaims[i]
		c := Claim{PodClaim: pc.Name}
		if pc.ResourceClaimTemplateName != nil {
			c.Template = *pc.ResourceClaimTemplateName
		}
		name, _, err := resourceclaim.Name(pod, pc)
		if errors.Is(err, resourceclaim.ErrClaimNotFound) {
			// Not recorded in the pod yet; a claim of its PodGroup
			// may exist all the same.
			if group := groupClaimName(ctx, client, pod, pc); group != "" {
				name, err = &group, nil
			}
		}
		switch {
		case errors.Is(err, resourceclaim.ErrClaimNotFound):
			// Not created yet: build it from the template.
		case err != nil:
			return nil, err
		case name == nil:
			// Deliberately not created (the controller decided the pod
			// does not need it).
			continue
		default:
			claim, err := client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *name, metav1.GetOptions{})
			switch {
			case err == nil:
				c.Created, c.Claim = true, claim
				out = append(out, c)
				continue
			case !apierrors.IsNotFound(err) || c.Template == "":
				return nil, notFound(err, "pod %s/%s: claim %q: ResourceClaim %s/%s", pod.Namespace, pod.Name, pc.Name, pod.Namespace, *name)
			}
			// Gone, but it comes from a template: explain the template.
		}
		tmpl, err := client.ResourceV1().ResourceClaimTemplates(pod.Namespace).Get(ctx, c.Template, metav1.GetOptions{})
		if err != nil {
			return nil, notFound(err, "pod %s/%s: claim %q: ResourceClaimTemplate %s/%s", pod.Namespace, pod.Name, pc.Name, pod.Namespace, c.Template)
		}
		c.Claim = &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: pod.Namespace,
				// The controller adds a random suffix; this name only
				// labels the claim in the report.
				Name: pod.Name + "-" + pc.Name,
				UID:  types.UID(fmt.Sprintf("explain-%s-%s", pod.UID, pc.Name)),
			},
			Spec: *tmpl.Spec.Spec.DeepCopy(),
		}
		out = append(out, c)
	}
	return out, nil
}

// groupClaimName returns the name of the claim the pod's PodGroup holds
// for pc (KEP-5729): a pod whose claim matches one of its PodGroup's
// spec.resourceClaims exactly uses the group's claim, which the resource
// claim controller records in the PodGroup's status, and in the pod's only
// when it syncs the pod. It is "" when the pod has no PodGroup, the claim
// is the pod's own, the group has no claim for it yet, or the PodGroup
// cannot be read (not served, or forbidden): explaining does not need it.
func groupClaimName(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod, pc *corev1.PodResourceClaim) string {
	if pod.Spec.SchedulingGroup == nil || pod.Spec.SchedulingGroup.PodGroupName == nil {
		return ""
	}
	group, err := client.SchedulingV1beta1().PodGroups(pod.Namespace).Get(ctx, *pod.Spec.SchedulingGroup.PodGroupName, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	bind, err := resourceclaim.BindTo(pod, group, pc)
	if err != nil || bind.Resource != "podgroups" {
		return ""
	}
	for i := range group.Spec.ResourceClaims {
		if gc := &group.Spec.ResourceClaims[i]; gc.Name == pc.Name {
			if name, _, err := resourceclaim.NameFromPodGroup(group, gc); err == nil && name != nil {
				return *name
			}
		}
	}
	return ""
}

// notFound names what is missing when err is NotFound, and wraps err
// otherwise.
func notFound(err error, format string, args ...any) error {
	what := fmt.Sprintf(format, args...)
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%s not found", what)
	}
	return fmt.Errorf("get %s: %w", what, err)
}
