package explain

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/deployments/deviceclasses"
)

// TestNineGPUsOnEightGPUNodes: the user's report: 9 GPUs where no node has
// more than 8. The request is named, with the count per node.
func TestNineGPUsOnEightGPUNodes(t *testing.T) {
	objs, _ := fleetSlices(t, "dgx-h100", "dgx-a100-mig")
	objs = append(objs, podWithTemplate("default", "nine", gpus("gpus", "gpu.nvidia.com", 9))...)
	rep, err := explain(t, pod("nine"), objs...)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Verdict != VerdictFails || rep.Summary != "cannot allocate: no node of 2 fits every claim" {
		t.Errorf("verdict %s, summary %q", rep.Verdict, rep.Summary)
	}
	if want := []string{"dgx-a100-0", "dgx-h100-0"}; !reflect.DeepEqual(rep.Nodes, want) {
		t.Errorf("nodes %v, want %v", rep.Nodes, want)
	}
	c := rep.Claims[0]
	if c.Name != "nine-gpu" || c.Template != "nine-tmpl" || c.Created || len(c.FitNodes) != 0 {
		t.Errorf("claim %+v: want nine-gpu from template nine-tmpl, not created, fitting nowhere", c)
	}
	r := c.Requests[0]
	const reason = "asks for 9 devices of class gpu.nvidia.com; the cluster has 12, at most 8 on one node (dgx-h100-0); 0 nodes can satisfy it"
	if r.Name != "gpus" || r.Status != StatusFails || r.Reason != reason {
		t.Errorf("request %s %s: %q\nwant %q", r.Name, r.Status, r.Reason, reason)
	}
	// dgx-a100-0 has 4 whole GPUs (the other 4 run MIG), dgx-h100-0 8.
	want := DeviceCounts{InClass: 12, Selected: 12, WithCapacity: 12, Free: 12, MostOnANode: 8, MostOnANodeName: "dgx-h100-0", MostFreeOnANode: 8, MostFreeOnANodeName: "dgx-h100-0"}
	if *r.Devices != want {
		t.Errorf("counts %+v\nwant %+v", *r.Devices, want)
	}
	mustContain(t, Text(rep),
		"pod default/nine: cannot allocate: no node of 2 fits every claim\n",
		"scheduler says: 0/2 nodes are available: 2 cannot allocate all claims.\n",
		"claim nine-gpu (from template nine-tmpl, not created yet): fits on no node\n",
		"    request gpus: FAILS: "+reason+"\n")
}

// TestMIGProfileNoGPUHas: a selector nothing passes is named, with the
// values the devices have and the nearest device.
func TestMIGProfileNoGPUHas(t *testing.T) {
	for _, tc := range []struct {
		name      string
		fleets    []string
		selectors []string
		reason    string
		clauses   []ClauseReport
		nearest   NearestDevice
	}{{
		name:      "one clause",
		fleets:    []string{"dgx-h100", "dgx-a100-mig"},
		selectors: []string{"device.attributes['gpu.nvidia.com'].profile == '1g.20gb'"},
		reason:    `no device of class mig.nvidia.com has profile == "1g.20gb"; nearest: gpu-1-mig-3g20gb-9-4 on dgx-a100-0 (profile 3g.20gb)`,
		clauses: []ClauseReport{{From: "request", Expression: "device.attributes['gpu.nvidia.com'].profile == '1g.20gb'", Text: `profile == "1g.20gb"`,
			Passed: 0, Of: 14, Attribute: "profile", Values: []string{"1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}}},
		nearest: NearestDevice{Node: "dgx-a100-0", Pool: "dgx-a100-0", Device: "gpu-1-mig-3g20gb-9-4", Passes: 0, Of: 1,
			Differences: []string{"profile 3g.20gb"}, Failing: []string{`profile == "1g.20gb"`}, State: "free"},
	}, {
		// Each clause passes some device, none passes both: the nearest
		// is the A100's 1g.5gb, whose profile is nearer 1g.10gb than the
		// H100's product name is to the A100's.
		name:   "clauses that pass apart",
		fleets: []string{"demo"},
		selectors: []string{`device.attributes["gpu.nvidia.com"].profile == "1g.10gb" &&
			device.attributes["gpu.nvidia.com"].productName == "NVIDIA A100-SXM4-40GB"`},
		reason: `no device of class mig.nvidia.com passes all of the request's selector clauses together, though each passes some; nearest: gpu-0-mig-1g5gb-19-0 on dgx-a100-0 (profile 1g.5gb)`,
		nearest: NearestDevice{Node: "dgx-a100-0", Pool: "dgx-a100-0", Device: "gpu-0-mig-1g5gb-19-0", Passes: 1, Of: 2,
			Differences: []string{"profile 1g.5gb"}, Failing: []string{`profile == "1g.10gb"`}, State: "free"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			objs, _ := fleetSlices(t, tc.fleets...)
			objs = append(objs, podWithTemplate("default", "mig", gpus("mig", "mig.nvidia.com", 1, tc.selectors...))...)
			rep, err := explain(t, pod("mig"), objs...)
			if err != nil {
				t.Fatal(err)
			}
			r := rep.Claims[0].Requests[0]
			if r.Status != StatusFails || r.Reason != tc.reason {
				t.Errorf("request %s: %q\nwant %q", r.Status, r.Reason, tc.reason)
			}
			if tc.clauses != nil && !reflect.DeepEqual(r.Clauses, tc.clauses) {
				t.Errorf("clauses %+v\nwant %+v", r.Clauses, tc.clauses)
			}
			if r.Nearest == nil || !reflect.DeepEqual(*r.Nearest, tc.nearest) {
				t.Errorf("nearest %+v\nwant %+v", r.Nearest, tc.nearest)
			}
			mustContain(t, Text(rep), "request mig: FAILS: "+tc.reason+"\n", "nearest device: "+tc.nearest.Node+"/"+tc.nearest.Device+", free")
		})
	}
}

// TestDevicesInUse: matching devices held by other claims, or blocked by
// the shared counters of MIG devices other claims hold, are counted and
// their holders named.
func TestDevicesInUse(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fleets  []string
		held    []runtime.Object
		request resourceapi.DeviceRequest
		reason  string
		counts  DeviceCounts
	}{{
		name:   "every GPU held",
		fleets: []string{"dgx-h100"},
		held: []runtime.Object{
			heldClaim("ml", "train-a", "dgx-h100-0", "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5"),
			heldClaim("ml", "train-b", "dgx-h100-0", "gpu-6", "gpu-7"),
		},
		request: gpus("gpus", "gpu.nvidia.com", 2),
		reason:  "asks for 2 devices of class gpu.nvidia.com; the cluster has 8, none of them free (8 held by other claims: ml/train-a (6), ml/train-b (2))",
		counts:  DeviceCounts{InClass: 8, Selected: 8, WithCapacity: 8, InUse: 8, MostOnANode: 8, MostOnANodeName: "dgx-h100-0"},
	}, {
		name:   "one GPU left for two",
		fleets: []string{"dgx-h100"},
		held: []runtime.Object{
			heldClaim("ml", "train-a", "dgx-h100-0", "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-7"),
		},
		request: gpus("gpus", "gpu.nvidia.com", 2),
		reason:  "asks for 2 devices of class gpu.nvidia.com; the cluster has 8, 1 of them free (7 held by other claims: ml/train-a (7)), at most 1 on one node (dgx-h100-0)",
		counts:  DeviceCounts{InClass: 8, Selected: 8, WithCapacity: 8, Free: 1, InUse: 7, MostOnANode: 8, MostOnANodeName: "dgx-h100-0", MostFreeOnANode: 1, MostFreeOnANodeName: "dgx-h100-0"},
	}, {
		// dgx-h100-1 creates MIG devices on demand on GPUs 4-7: a 7g.80gb
		// held on each leaves none of their 16 1g.20gb placements.
		name:   "dynamic MIG placements blocked by counters",
		fleets: []string{"demo"},
		held: []runtime.Object{
			heldClaim("ml", "whole-migs", "dgx-h100-1", "gpu-4-mig-7g80gb-0-0", "gpu-5-mig-7g80gb-0-0", "gpu-6-mig-7g80gb-0-0", "gpu-7-mig-7g80gb-0-0"),
		},
		request: gpus("mig", "mig.nvidia.com", 1, "device.attributes['gpu.nvidia.com'].profile == '1g.20gb'"),
		reason:  "asks for 1 device of class mig.nvidia.com; the cluster has 120, 16 pass the request's selectors, none of them free (16 blocked by shared counters that other claims' devices use: gpu-4-mig-7g80gb-0-0 of claim ml/whole-migs (4), gpu-5-mig-7g80gb-0-0 of claim ml/whole-migs (4), gpu-6-mig-7g80gb-0-0 of claim ml/whole-migs (4), gpu-7-mig-7g80gb-0-0 of claim ml/whole-migs (4))",
		counts:  DeviceCounts{InClass: 120, Selected: 16, WithCapacity: 16, CountersUsedUp: 16, MostOnANode: 16, MostOnANodeName: "dgx-h100-1"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			objs, _ := fleetSlices(t, tc.fleets...)
			objs = append(objs, tc.held...)
			objs = append(objs, podWithTemplate("default", "wants", tc.request)...)
			rep, err := explain(t, pod("wants"), objs...)
			if err != nil {
				t.Fatal(err)
			}
			r := rep.Claims[0].Requests[0]
			if rep.Verdict != VerdictFails || r.Status != StatusFails || r.Reason != tc.reason {
				t.Errorf("verdict %s, request %s: %q\nwant %q", rep.Verdict, r.Status, r.Reason, tc.reason)
			}
			if *r.Devices != tc.counts {
				t.Errorf("counts %+v\nwant %+v", *r.Devices, tc.counts)
			}
		})
	}
}

// TestSuccessfulPlacement: a claim that fits says where the allocator
// puts it, around the devices other claims hold.
func TestSuccessfulPlacement(t *testing.T) {
	objs, _ := fleetSlices(t, "dgx-h100", "dgx-a100-mig")
	objs = append(objs, heldClaim("ml", "train", "dgx-a100-0", "gpu-4"), heldClaim("ml", "train-2", "dgx-h100-0", "gpu-0"))
	objs = append(objs, podWithTemplate("default", "two", gpus("gpus", "gpu.nvidia.com", 2, `device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H100")`))...)
	rep, err := explain(t, pod("two"), objs...)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Verdict != VerdictFits || !reflect.DeepEqual(rep.FitNodes, []string{"dgx-h100-0"}) {
		t.Errorf("verdict %s on %v, want fits on dgx-h100-0", rep.Verdict, rep.FitNodes)
	}
	want := []PlacedDevice{
		{Claim: "two-gpu", Request: "gpus", Node: "dgx-h100-0", Driver: driver, Pool: "dgx-h100-0", Device: "gpu-1"},
		{Claim: "two-gpu", Request: "gpus", Node: "dgx-h100-0", Driver: driver, Pool: "dgx-h100-0", Device: "gpu-2"},
	}
	if !reflect.DeepEqual(rep.Placement, want) {
		t.Errorf("placement %+v\nwant %+v", rep.Placement, want)
	}
	mustContain(t, Text(rep),
		"pod default/two: would allocate on dgx-h100-0 (1 of 2 nodes fit: dgx-h100-0)\n",
		"would allocate: claim two-gpu request gpus -> dgx-h100-0/gpu-1\n",
		"would allocate: claim two-gpu request gpus -> dgx-h100-0/gpu-2\n")
}

// TestFirstAvailable: subrequests are explained one by one; the one the
// allocator would use is named.
func TestFirstAvailable(t *testing.T) {
	sub := func(name string, count int64, selectors ...string) resourceapi.DeviceSubRequest {
		r := gpus(name, "gpu.nvidia.com", count, selectors...)
		return resourceapi.DeviceSubRequest{Name: name, DeviceClassName: r.Exactly.DeviceClassName, AllocationMode: r.Exactly.AllocationMode, Count: count, Selectors: r.Exactly.Selectors}
	}
	const nine = "asks for 9 devices of class gpu.nvidia.com; the cluster has 8, at most 8 on one node (dgx-h100-0); 0 nodes can satisfy it"
	t.Run("second fits", func(t *testing.T) {
		objs, _ := fleetSlices(t, "dgx-h100")
		objs = append(objs, podWithTemplate("default", "fa", resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{sub("nine", 9), sub("two", 2)}})...)
		rep, err := explain(t, pod("fa"), objs...)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Verdict != VerdictFits || len(rep.Placement) != 2 || rep.Placement[0].Request != "gpu/two" {
			t.Errorf("verdict %s, placement %+v: want two devices for gpu/two", rep.Verdict, rep.Placement)
		}
	})
	t.Run("none fits", func(t *testing.T) {
		objs, _ := fleetSlices(t, "dgx-h100")
		objs = append(objs, podWithTemplate("default", "fa", resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
			sub("nine", 9), sub("a100", 2, `device.attributes["gpu.nvidia.com"].productName == "NVIDIA A100-SXM4-80GB"`)}})...)
		rep, err := explain(t, pod("fa"), objs...)
		if err != nil {
			t.Fatal(err)
		}
		r := rep.Claims[0].Requests[0]
		if r.Status != StatusFails || r.Reason != "none of its 2 subrequests can be allocated" || len(r.Subrequests) != 2 {
			t.Fatalf("request %s: %q with %d subrequests", r.Status, r.Reason, len(r.Subrequests))
		}
		if s := r.Subrequests[0]; s.Name != "gpu/nine" || s.Reason != nine {
			t.Errorf("subrequest %s: %q\nwant %q", s.Name, s.Reason, nine)
		}
		const a100 = `no device of class gpu.nvidia.com has productName == "NVIDIA A100-SXM4-80GB"; nearest: gpu-0 on dgx-h100-0 (productName NVIDIA H100 80GB HBM3)`
		if s := r.Subrequests[1]; s.Name != "gpu/a100" || s.Reason != a100 {
			t.Errorf("subrequest %s: %q\nwant %q", s.Name, s.Reason, a100)
		}
		mustContain(t, Text(rep),
			"    request gpu (firstAvailable): FAILS: none of its 2 subrequests can be allocated\n",
			"      subrequest gpu/nine: FAILS: "+nine+"\n",
			"      subrequest gpu/a100: FAILS: "+a100+"\n")
	})
}

// TestBadInput: what is missing is named.
func TestBadInput(t *testing.T) {
	fleet, _ := fleetSlices(t, "dgx-h100")
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "plain"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}}}
	noTemplate := podWithTemplate("default", "orphan", gpus("gpus", "gpu.nvidia.com", 1))[1:]
	for _, tc := range []struct {
		name   string
		target Target
		objs   []runtime.Object
		err    string
	}{
		{"pod without claims", pod("plain"), slices.Concat(fleet, []runtime.Object{plain}), "pod default/plain has no resource claims (spec.resourceClaims is empty): it asks for no DRA devices"},
		{"no such pod", pod("ghost"), fleet, "pod default/ghost not found"},
		{"no such claim", Target{Kind: KindClaim, Namespace: "ml", Name: "ghost"}, fleet, "ResourceClaim ml/ghost not found"},
		{"no template", pod("orphan"), slices.Concat(fleet, noTemplate), `pod default/orphan: claim "gpu": ResourceClaimTemplate default/orphan-tmpl not found`},
		{"no slices", pod("nine"), podWithTemplate("default", "nine", gpus("gpus", "gpu.nvidia.com", 9)), "no ResourceSlices in the cluster: no DRA driver has published devices (is gpudra's kubelet plugin running on the GPU nodes?)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := explain(t, tc.target, tc.objs...)
			if err == nil || err.Error() != tc.err {
				t.Errorf("got %v\nwant %s", err, tc.err)
			}
		})
	}
	t.Run("unknown class", func(t *testing.T) {
		objs := slices.Concat(fleet, podWithTemplate("default", "typo", gpus("gpus", "gpu.nvidia", 1)))
		rep, err := explain(t, pod("typo"), objs...)
		if err != nil {
			t.Fatal(err)
		}
		// The cluster has a class per MIG profile too: the nearest are named.
		classes, err := deviceclasses.All()
		if err != nil {
			t.Fatal(err)
		}
		reason := fmt.Sprintf(`DeviceClass "gpu.nvidia" does not exist; nearest of the cluster's %d: gpu.nvidia.com, mig.nvidia.com, vfio.gpu.nvidia.com, mig-1g.5gb.nvidia.com, mig-1g.6gb.nvidia.com`, len(classes))
		if r := rep.Claims[0].Requests[0]; r.Status != StatusFails || r.Reason != reason {
			t.Errorf("request %s: %q\nwant %q", r.Status, r.Reason, reason)
		}
		if len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0], `could not retrieve device class gpu.nvidia`) {
			t.Errorf("problems %q: want the allocator's error once", rep.Problems)
		}
	})
}

// TestCapacity: a capacity request larger than any device names the
// device with the most.
func TestCapacity(t *testing.T) {
	objs, _ := fleetSlices(t, "dgx-h100")
	r := gpus("gpus", "gpu.nvidia.com", 1)
	r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": quantity("100Gi")}}
	objs = append(objs, podWithTemplate("default", "big", r)...)
	rep, err := explain(t, pod("big"), objs...)
	if err != nil {
		t.Fatal(err)
	}
	const reason = "asks for 1 device of class gpu.nvidia.com with memory 100Gi; none of the 8 devices that pass the selectors can give that much (dgx-h100-0/gpu-0: capacity memory: asks for 100Gi, the device has 81559Mi)"
	if got := rep.Claims[0].Requests[0]; got.Reason != reason || got.Devices.WithCapacity != 0 {
		t.Errorf("request %q (%d with capacity)\nwant %q", got.Reason, got.Devices.WithCapacity, reason)
	}
}

// TestTogether: requests that each fit alone but not together: a
// matchAttribute constraint, or devices they compete for.
func TestTogether(t *testing.T) {
	objs, _ := fleetSlices(t, "dgx-h100")
	numa := podWithTemplate("default", "numa", gpus("a", "gpu.nvidia.com", 5), gpus("b", "gpu.nvidia.com", 1))
	numa[0].(*resourceapi.ResourceClaimTemplate).Spec.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("resource.kubernetes.io/numaNode"))}}
	objs = append(objs, numa...)
	objs = append(objs, podWithTemplate("default", "compete", gpus("a", "gpu.nvidia.com", 5), gpus("b", "gpu.nvidia.com", 4))...)

	rep, err := explain(t, pod("numa"), objs...)
	if err != nil {
		t.Fatal(err)
	}
	c := rep.Claims[0]
	for _, r := range c.Requests {
		if r.Status != StatusOK {
			t.Errorf("request %s: %s %q, want ok by itself", r.Name, r.Status, r.Reason)
		}
	}
	// DGX H100: GPUs 0-3 on NUMA node 0, 4-7 on 1.
	want := []ConstraintReport{{Kind: "matchAttribute", Attribute: "resource.kubernetes.io/numaNode", Status: StatusFails,
		Reason: "no node has devices for requests a (5), b (1) that all share one value of resource.kubernetes.io/numaNode; the free devices on dgx-h100-0 by value: 0: 4 for a, 4 for b; 1: 4 for a, 4 for b"}}
	if !reflect.DeepEqual(c.Constraints, want) {
		t.Errorf("constraints %+v\nwant %+v", c.Constraints, want)
	}

	rep, err = explain(t, pod("compete"), objs...)
	if err != nil {
		t.Fatal(err)
	}
	const problem = "claim compete-gpu: each request fits by itself, but not all at once: on dgx-h100-0 a asks for 5 of 8 it could have, b asks for 4 of 8 it could have, and they compete for the same devices"
	if !reflect.DeepEqual(rep.Problems, []string{problem}) {
		t.Errorf("problems %q\nwant %q", rep.Problems, problem)
	}
}

// TestClaimTargets: a claim can be explained by name; an allocated one
// says where it is.
func TestClaimTargets(t *testing.T) {
	objs, _ := fleetSlices(t, "dgx-h100")
	pending := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "nine"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{gpus("gpus", "gpu.nvidia.com", 9)}}}}
	done := heldClaim("ml", "train", "dgx-h100-0", "gpu-3")
	objs = append(objs, pending, done)

	rep, err := explain(t, Target{Kind: KindClaim, Namespace: "ml", Name: "nine"}, objs...)
	if err != nil {
		t.Fatal(err)
	}
	const reason = "asks for 9 devices of class gpu.nvidia.com; the cluster has 8, at most 8 on one node (dgx-h100-0); 0 nodes can satisfy it"
	if r := rep.Claims[0].Requests[0]; rep.Verdict != VerdictFails || !rep.Claims[0].Created || r.Reason != reason {
		t.Errorf("verdict %s, request %q\nwant %q", rep.Verdict, r.Reason, reason)
	}
	mustContain(t, Text(rep), "resourceclaim ml/nine: cannot allocate: no node of 1 fits every claim\n", "  claim nine: fits on no node\n")

	rep, err = explain(t, Target{Kind: KindClaim, Namespace: "ml", Name: "train"}, objs...)
	if err != nil {
		t.Fatal(err)
	}
	want := []PlacedDevice{{Claim: "train", Request: "gpu", Node: "dgx-h100-0", Driver: driver, Pool: "dgx-h100-0", Device: "gpu-3"}}
	if rep.Verdict != VerdictAllocated || !reflect.DeepEqual(rep.Claims[0].Allocated, want) {
		t.Errorf("verdict %s, allocated %+v", rep.Verdict, rep.Claims[0].Allocated)
	}
	mustContain(t, Text(rep), "  claim train: allocated\n    request gpu -> dgx-h100-0/gpu-3\n")
}

// TestNodesThePodCannotUse: the pod's node selector leaves nodes out, and
// the counts are of the nodes it can use.
func TestNodesThePodCannotUse(t *testing.T) {
	objs, _ := fleetSlices(t, "dgx-h100", "dgx-a100-mig")
	p := podWithTemplate("default", "a100s", gpus("gpus", "gpu.nvidia.com", 5))
	p[1].(*corev1.Pod).Spec.NodeSelector = map[string]string{corev1.LabelHostname: "dgx-a100-0"}
	objs = append(objs, p...)
	rep, err := explain(t, pod("a100s"), objs...)
	if err != nil {
		t.Fatal(err)
	}
	wantExcluded := []NodeExclusion{{Node: "dgx-h100-0", Reason: "the pod's node selector or required node affinity does not match"}}
	if !reflect.DeepEqual(rep.ExcludedNodes, wantExcluded) || !reflect.DeepEqual(rep.Nodes, []string{"dgx-a100-0"}) {
		t.Errorf("nodes %v, excluded %+v", rep.Nodes, rep.ExcludedNodes)
	}
	const reason = "asks for 5 devices of class gpu.nvidia.com; the cluster has 12, at most 4 on one node (dgx-a100-0); 0 nodes can satisfy it"
	if r := rep.Claims[0].Requests[0]; r.Reason != reason {
		t.Errorf("request %q\nwant %q", r.Reason, reason)
	}
	mustContain(t, Text(rep), "  node dgx-h100-0 not considered: the pod's node selector or required node affinity does not match\n")
}

// TestForbiddenLists: without permission to list nodes, the nodes the
// slices name are tried; without permission to list claims in all
// namespaces, those of the pod's namespace are; warnings say so.
func TestForbiddenLists(t *testing.T) {
	objs, _ := fleetSlices(t, "dgx-h100")
	objs = append(objs, heldClaim("default", "train", "dgx-h100-0", "gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-4", "gpu-5", "gpu-6"), heldClaim("ml", "unseen", "dgx-h100-0", "gpu-7"))
	objs = append(objs, podWithTemplate("default", "two", gpus("gpus", "gpu.nvidia.com", 2))...)
	client := fake.NewClientset(objs...)
	forbidden := func(resource string) k8stesting.ReactionFunc {
		return func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetNamespace() != "" {
				return false, nil, nil
			}
			return true, nil, apierrors.NewForbidden(corev1.Resource(resource), "", errors.New("RBAC"))
		}
	}
	client.PrependReactor("list", "nodes", forbidden("nodes"))
	client.PrependReactor("list", "resourceclaims", forbidden("resourceclaims"))
	rep, err := Explain(context.Background(), client, pod("two"))
	if err != nil {
		t.Fatal(err)
	}
	wantWarnings := []string{
		"ResourceClaims of all namespaces cannot be listed (forbidden): devices that claims outside default hold are counted as free",
		"nodes cannot be listed (forbidden): node labels, taints and the pod's node affinity are not checked; the nodes the ResourceSlices name are tried",
	}
	if !reflect.DeepEqual(rep.Warnings, wantWarnings) || !reflect.DeepEqual(rep.Nodes, []string{"dgx-h100-0"}) {
		t.Errorf("nodes %v, warnings %q", rep.Nodes, rep.Warnings)
	}
	const reason = "asks for 2 devices of class gpu.nvidia.com; the cluster has 8, 1 of them free (7 held by other claims: default/train (7)), at most 1 on one node (dgx-h100-0)"
	if r := rep.Claims[0].Requests[0]; r.Reason != reason {
		t.Errorf("request %q\nwant %q", r.Reason, reason)
	}
	mustContain(t, Text(rep), "  warning: "+wantWarnings[0]+"\n")
}

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		kind Kind
		name string
		err  string
	}{
		{"train", KindPod, "train", ""},
		{"pod/train", KindPod, "train", ""},
		{"pods/train", KindPod, "train", ""},
		{"po/train", KindPod, "train", ""},
		{"resourceclaim/gpus", KindClaim, "gpus", ""},
		{"resourceclaims/gpus", KindClaim, "gpus", ""},
		{"deployment/x", "", "", `"deployment/x": unknown kind "deployment": want pod or resourceclaim`},
		{"pod/", "", "", `"pod/": want pod/NAME, resourceclaim/NAME or a pod's NAME`},
		{"pod/a/b", "", "", `"pod/a/b": want pod/NAME, resourceclaim/NAME or a pod's NAME`},
	} {
		kind, name, err := ParseTarget(tc.arg)
		if kind != tc.kind || name != tc.name || (err == nil) != (tc.err == "") || (err != nil && err.Error() != tc.err) {
			t.Errorf("ParseTarget(%q) = %q, %q, %v; want %q, %q, %s", tc.arg, kind, name, err, tc.kind, tc.name, tc.err)
		}
	}
}

// TestJSON: -o json carries the same findings for scripts.
func TestJSON(t *testing.T) {
	objs, _ := fleetSlices(t, "dgx-h100")
	objs = append(objs, podWithTemplate("default", "nine", gpus("gpus", "gpu.nvidia.com", 9))...)
	rep, err := explain(t, pod("nine"), objs...)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := Write(&buf, "json", rep); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Verdict string
		Claims  []struct {
			Requests []struct {
				Name, Status, Reason string
				Devices              struct{ MostOnANode int }
			}
		}
	}
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	r := got.Claims[0].Requests[0]
	if got.Verdict != "fails" || r.Name != "gpus" || r.Status != "fails" || r.Devices.MostOnANode != 8 || !strings.HasPrefix(r.Reason, "asks for 9 devices") {
		t.Errorf("JSON %s", buf.String())
	}
	if err := Write(&buf, "xml", rep); err == nil || err.Error() != `unknown output format "xml": supported values: text, json` {
		t.Errorf("xml: %v", err)
	}
}

// TestCELRuntimeErrors: a selector that reads an attribute some devices of
// the class lack stops the scheduler for the whole pod, unless CEL never
// gets to it (false && error is false; selectors stop at the first false).
func TestCELRuntimeErrors(t *testing.T) {
	const (
		profile = "device.attributes['gpu.nvidia.com'].profile == '1g.10gb'"
		noIndex = "device.attributes['gpu.nvidia.com'].index > 100"
		isMIG   = "device.attributes['gpu.nvidia.com'].type == 'mig'"
	)
	const fatal = `selector clause "` + profile + `" fails with a CEL runtime error, which stops the scheduler for the whole pod: on dgx-h100-0/gpu-0: no such key: profile`
	for _, tc := range []struct {
		name      string
		selectors []string
		reason    string
		stops     bool
	}{
		{"erring selector", []string{profile}, fatal, true},
		{"erring selector first", []string{profile, noIndex}, fatal, true},
		{"false selector first", []string{noIndex, profile}, "no device of class gpu.nvidia.com has index > 100; nearest: gpu-7 on dgx-h100-0 (index 7, profile (none))", false},
		{"false clause beside", []string{isMIG + " && " + profile}, `no device of class gpu.nvidia.com has type == "mig"; nearest: gpu-0 on dgx-h100-0 (type gpu, profile (none))`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, _ := fleetSlices(t, "dgx-h100")
			objs = append(objs, podWithTemplate("default", "p", gpus("gpus", "gpu.nvidia.com", 1, tc.selectors...))...)
			rep, err := explain(t, pod("p"), objs...)
			if err != nil {
				t.Fatal(err)
			}
			if r := rep.Claims[0].Requests[0]; r.Status != StatusFails || !strings.HasPrefix(r.Reason, tc.reason) {
				t.Errorf("request %s: %q\nwant %q...", r.Status, r.Reason, tc.reason)
			}
			stops := len(rep.Problems) == 1 && strings.Contains(rep.Problems[0], "CEL runtime error: no such key: profile")
			if stops != tc.stops {
				t.Errorf("problems %q: the allocator stopping is %v, want %v", rep.Problems, stops, tc.stops)
			}
		})
	}
}

// TestClaimsOnDifferentNodes: two claims of one pod that each fit, but
// only on different nodes.
func TestClaimsOnDifferentNodes(t *testing.T) {
	objs, _ := fleetSlices(t, "dgx-h100", "dgx-a100-mig")
	h100 := podWithTemplate("default", "both", gpus("h100s", "gpu.nvidia.com", 8))
	a100 := podWithTemplate("default", "a100", gpus("a100s", "gpu.nvidia.com", 2, `device.attributes["gpu.nvidia.com"].productName == "NVIDIA A100-SXM4-40GB"`))
	p := h100[1].(*corev1.Pod)
	p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: "a100", ResourceClaimTemplateName: ptr.To("a100-tmpl")})
	objs = append(objs, h100[0], a100[0], p)
	rep, err := explain(t, pod("both"), objs...)
	if err != nil {
		t.Fatal(err)
	}
	const problem = "each claim fits by itself, but on different nodes, and a pod's claims must share one node: both-gpu on dgx-h100-0; both-a100 on dgx-a100-0"
	if rep.Verdict != VerdictFails || !reflect.DeepEqual(rep.Problems, []string{problem}) {
		t.Errorf("verdict %s, problems %q\nwant %q", rep.Verdict, rep.Problems, problem)
	}
	for _, c := range rep.Claims {
		if len(c.FitNodes) != 1 || c.Requests[0].Status != StatusOK {
			t.Errorf("claim %s fits on %v, request %s", c.Name, c.FitNodes, c.Requests[0].Status)
		}
	}
	mustContain(t, Text(rep), "  problem: "+problem+"\n", "  claim both-gpu (from template both-tmpl, not created yet): fits by itself on dgx-h100-0\n")
}

// TestTextCollapsesExcludedNodes: the nodes excluded for one reason take
// one line (they once took one each: a thousand on a fleet).
func TestTextCollapsesExcludedNodes(t *testing.T) {
	const selector = "the pod's node selector or required node affinity does not match"
	rep := &Report{Kind: "Pod", Namespace: "default", Name: "p", Summary: "pending"}
	for i := range 8 {
		rep.ExcludedNodes = append(rep.ExcludedNodes, NodeExclusion{Node: fmt.Sprintf("n-%d", i), Reason: selector})
	}
	rep.ExcludedNodes = append(rep.ExcludedNodes, NodeExclusion{Node: "cordoned", Reason: "the node is unschedulable"})
	text := Text(rep)
	mustContain(t, text, "  8 nodes not considered (n-0, n-1, n-2, n-3, n-4 and 3 more): "+selector+"\n")
	mustContain(t, text, "  node cordoned not considered: the node is unschedulable\n")
	if n := strings.Count(text, "not considered"); n != 2 {
		t.Errorf("%d lines of excluded nodes, want 2:\n%s", n, text)
	}
}

// TestPodGroupClaim: a pod of a PodGroup (KEP-5729) whose claim matches
// the group's uses the claim the controller made for the group, recorded
// in the PodGroup's status before the pod's: explain reads that claim,
// allocated already, instead of a fresh one from the template.
func TestPodGroupClaim(t *testing.T) {
	objs, _ := fleetSlices(t, "dgx-h100")
	p := podWithTemplate("default", "trainer-0", gpus("gpus", "gpu.nvidia.com", 2))
	member := p[1].(*corev1.Pod)
	member.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To("trainers")}
	tmpl := *member.Spec.ResourceClaims[0].ResourceClaimTemplateName
	held := heldClaim("default", "trainers-gpu-x7k2p", "dgx-h100-0", "gpu-0", "gpu-1")
	held.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{APIGroup: "scheduling.k8s.io", Resource: "podgroups", Name: "trainers", UID: "pg"}}
	group := &schedulingv1beta1.PodGroup{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "trainers", UID: "pg"},
		Spec:       schedulingv1beta1.PodGroupSpec{ResourceClaims: []schedulingv1beta1.PodGroupResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl}}},
		Status:     schedulingv1beta1.PodGroupStatus{ResourceClaimStatuses: []schedulingv1beta1.PodGroupResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To(held.Name)}}},
	}
	objs = append(append(objs, p...), held, group)
	rep, err := explain(t, pod("trainer-0"), objs...)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Claims) != 1 || rep.Claims[0].Name != held.Name || !rep.Claims[0].Created || rep.Verdict != VerdictAllocated {
		t.Errorf("claims %+v, verdict %s; want the group's claim %s, allocated", rep.Claims, rep.Verdict, held.Name)
	}
}
