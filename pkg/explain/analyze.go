package explain

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/allocation"
)

// analyzer holds what one explanation works with.
type analyzer struct {
	in      *Input
	cel     *cel.Cache
	classes map[string]*resourceapi.DeviceClass
	// nodes are the candidate nodes, sorted by name.
	nodes     []*corev1.Node
	allocated structured.AllocatedState
	owners    map[structured.DeviceID]string
	alloc     structured.Allocator
	inv       *inventory
}

// Analyze explains the input: it needs no API server, so tests and other
// tools can feed it objects of their own.
func Analyze(ctx context.Context, in *Input) (*Report, error) {
	rep := &Report{Kind: in.Target.Kind, Namespace: in.Target.Namespace, Name: in.Target.Name, Warnings: slices.Clone(in.Warnings), Notices: slices.Clone(in.Notices)}
	if pod := in.Pod; pod != nil {
		rep.Phase, rep.NodeName = string(pod.Status.Phase), pod.Spec.NodeName
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				rep.SchedulerMessage = c.Message
			}
		}
	}
	a := &analyzer{in: in, cel: cel.NewCache(200, cel.Features{EnableConsumableCapacity: allocation.Features.ConsumableCapacity}), classes: map[string]*resourceapi.DeviceClass{}}
	for _, c := range in.Classes {
		a.classes[c.Name] = c
	}
	a.allocatedState()

	var pending []*resourceapi.ResourceClaim
	var allocatedSelectors []*corev1.NodeSelector
	for _, c := range in.Claims {
		cr := ClaimReport{Name: c.Claim.Name, PodClaim: c.PodClaim, Template: c.Template, Created: c.Created}
		if alloc := c.Claim.Status.Allocation; alloc != nil {
			for _, r := range alloc.Devices.Results {
				cr.Allocated = append(cr.Allocated, PlacedDevice{Claim: c.Claim.Name, Request: r.Request, Node: nodeOfPool(in.Slices, r.Driver, r.Pool, r.Device), Driver: r.Driver, Pool: r.Pool, Device: r.Device})
			}
			allocatedSelectors = append(allocatedSelectors, alloc.NodeSelector)
		} else {
			pending = append(pending, c.Claim)
		}
		rep.Claims = append(rep.Claims, cr)
	}

	var err error
	if rep.ExcludedNodes, err = a.candidateNodes(allocatedSelectors); err != nil {
		return nil, err
	}
	for _, n := range a.nodes {
		rep.Nodes = append(rep.Nodes, n.Name)
	}
	if len(pending) == 0 {
		rep.Verdict = VerdictAllocated
		rep.Summary = "every claim is allocated already; if the pod is still pending, devices are not what it waits for"
		return rep, nil
	}
	if a.inv, err = newInventory(in.Slices, a.nodes, a.allocated, a.owners); err != nil {
		return nil, err
	}
	rep.Warnings = append(rep.Warnings, a.inv.warnings...)
	if a.alloc, err = structured.NewAllocator(ctx, allocation.Features, a.allocated, allocation.Classes(in.Classes), in.Slices, a.cel); err != nil {
		return nil, fmt.Errorf("start the scheduler's allocator: %w", err)
	}

	fit, results, err := a.fit(ctx, pending, true)
	switch {
	case err != nil:
		rep.Verdict = VerdictFails
		rep.Problems = append(rep.Problems, "the scheduler's allocator stops with an error, so the scheduler tries no node: "+err.Error())
	case len(fit) > 0:
		rep.Verdict, rep.FitNodes = VerdictFits, fit
		for i, c := range pending {
			for _, r := range results[i].Devices.Results {
				rep.Placement = append(rep.Placement, PlacedDevice{Claim: c.Name, Request: r.Request, Node: fit[0], Driver: r.Driver, Pool: r.Pool, Device: r.Device})
			}
		}
		rep.Summary = fmt.Sprintf("would allocate on %s (%d of %d nodes fit: %s)", fit[0], len(fit), len(a.nodes), strings.Join(fit, ", "))
		return rep, nil
	default:
		rep.Verdict = VerdictFails
	}
	if len(a.nodes) == 0 {
		rep.Summary = "cannot allocate: no node to try"
	} else {
		rep.Summary = fmt.Sprintf("cannot allocate: no node of %d fits every claim", len(a.nodes))
	}
	a.diagnose(ctx, rep, pending)
	return rep, nil
}

// allocatedState is what other claims hold, built as kube-scheduler's
// DynamicResources plugin builds it: devices given for admin access are
// not held; shared devices hold capacity.
func (a *analyzer) allocatedState() {
	a.allocated = allocation.NewState()
	a.owners = map[structured.DeviceID]string{}
	explained := sets.New[string]()
	for _, c := range a.in.Claims {
		explained.Insert(c.Claim.Namespace + "/" + c.Claim.Name)
	}
	for _, c := range a.in.AllClaims {
		key := c.Namespace + "/" + c.Name
		if c.Status.Allocation == nil || explained.Has(key) {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if ptr.Deref(r.AdminAccess, false) {
				continue
			}
			id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
			if a.owners[id] == "" {
				a.owners[id] = key
			}
			allocation.Hold(&a.allocated, &r)
		}
	}
}

// candidateNodes picks the nodes to try: all nodes (or those the slices
// name when nodes could not be listed), less those the pod cannot go to
// for reasons of its own (node name, affinity, untolerated taints,
// cordoned) and those its allocated claims rule out.
func (a *analyzer) candidateNodes(allocated []*corev1.NodeSelector) ([]NodeExclusion, error) {
	nodes := a.in.Nodes
	if nodes == nil {
		names := sets.New[string]()
		for _, s := range a.in.Slices {
			if n := ptr.Deref(s.Spec.NodeName, ""); n != "" {
				names.Insert(n)
			}
		}
		for _, n := range sets.List(names) {
			nodes = append(nodes, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{corev1.LabelHostname: n}}})
		}
	}
	nodes = slices.Clone(nodes)
	slices.SortFunc(nodes, func(x, y *corev1.Node) int { return compareStrings(x.Name, y.Name) })
	var excluded []NodeExclusion
	pod := a.in.Pod
	for _, n := range nodes {
		why, err := a.excluded(pod, n, allocated)
		if err != nil {
			return nil, err
		}
		if why != "" {
			excluded = append(excluded, NodeExclusion{Node: n.Name, Reason: why})
			continue
		}
		a.nodes = append(a.nodes, n)
	}
	return excluded, nil
}

func (a *analyzer) excluded(pod *corev1.Pod, n *corev1.Node, allocated []*corev1.NodeSelector) (string, error) {
	for _, sel := range allocated {
		if sel == nil {
			continue
		}
		ns, err := nodeaffinity.NewNodeSelector(sel)
		if err != nil {
			return "", fmt.Errorf("node selector of an allocated claim: %w", err)
		}
		if !ns.Match(n) {
			return "another claim of the pod is allocated elsewhere", nil
		}
	}
	if pod == nil {
		return "", nil
	}
	if pod.Spec.NodeName != "" && pod.Spec.NodeName != n.Name {
		return "the pod is bound to " + pod.Spec.NodeName, nil
	}
	if ok, _ := nodeaffinity.GetRequiredNodeAffinity(pod).Match(n); !ok {
		return "the pod's node selector or required node affinity does not match", nil
	}
	noScheduleOrExecute := func(t *corev1.Taint) bool {
		return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
	}
	if taint, found := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), n.Spec.Taints, pod.Spec.Tolerations, noScheduleOrExecute, true); found {
		return fmt.Sprintf("untolerated taint %s=%s:%s", taint.Key, taint.Value, taint.Effect), nil
	}
	if n.Spec.Unschedulable && !slices.ContainsFunc(pod.Spec.Tolerations, func(t corev1.Toleration) bool {
		return t.ToleratesTaint(klog.Background(), &corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}, true)
	}) {
		return "cordoned (unschedulable)", nil
	}
	return "", nil
}

// fit runs the scheduler's allocator for the claims on every candidate
// node and returns the nodes where they fit and the allocation on the
// first; with all false it stops at the first. An error is one the
// allocator stops at for the whole pod (an unknown class, a CEL runtime
// error), as the scheduler does.
func (a *analyzer) fit(ctx context.Context, claims []*resourceapi.ResourceClaim, all bool) ([]string, []resourceapi.AllocationResult, error) {
	var nodes []string
	var first []resourceapi.AllocationResult
	for _, n := range a.nodes {
		results, err := a.alloc.Allocate(ctx, n, claims)
		if errors.Is(err, structured.ErrFailedAllocationOnNode) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		if results == nil {
			continue
		}
		nodes = append(nodes, n.Name)
		if first == nil {
			first = results
		}
		if !all {
			break
		}
	}
	return nodes, first, nil
}

// nodeOfPool returns the node of the slice that publishes the device, ""
// when it is not node-local.
func nodeOfPool(all []*resourceapi.ResourceSlice, driver, pool, dev string) string {
	for _, s := range all {
		if s.Spec.Driver != driver || s.Spec.Pool.Name != pool {
			continue
		}
		for _, d := range s.Spec.Devices {
			if d.Name == dev {
				return ptr.Deref(s.Spec.NodeName, ptr.Deref(d.NodeName, ""))
			}
		}
	}
	return ""
}

// classNames lists the classes, sorted.
func (a *analyzer) classNames() []string { return slices.Sorted(maps.Keys(a.classes)) }

// maxClassesNamed is how many classes a missing class's message names.
const maxClassesNamed = 5

// nearestClasses names the cluster's classes, or where it has many (one
// per MIG profile, say), the ones whose names are nearest to name (fewest
// edits), and how many there are.
func (a *analyzer) nearestClasses(name string) string {
	names := a.classNames()
	if len(names) <= maxClassesNamed {
		return "the cluster has " + strings.Join(names, ", ")
	}
	slices.SortStableFunc(names, func(x, y string) int { return editDistance(name, x) - editDistance(name, y) })
	return fmt.Sprintf("nearest of the cluster's %d: %s", len(names), strings.Join(names[:maxClassesNamed], ", "))
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}
