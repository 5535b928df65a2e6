package fleetview

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

const driver = "gpu.nvidia.com"

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }

// gpuDevices publishes GPU i of a node as gpudra does: the full GPU,
// its VFIO device and, with mig, two dynamic MIG placements.
func gpuDevices(i int, mig bool) []resourceapi.Device {
	bus := fmt.Sprintf("0000:%02x:00.0", i+1)
	uuid := fmt.Sprintf("GPU-%d", i)
	mem := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("80Gi")}}
	devs := []resourceapi.Device{
		{Name: fmt.Sprintf("gpu-%d", i), Capacity: mem, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": str("gpu"), "uuid": str(uuid), "productName": str("NVIDIA H100"), "sharingMode": str("none"), "resource.kubernetes.io/pciBusID": str(bus)}},
		{Name: fmt.Sprintf("gpu-vfio-%d", i), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"type": str("vfio"), "uuid": str(uuid), "resource.kubernetes.io/pciBusID": str(bus)}},
	}
	if mig {
		for start := range 2 {
			devs = append(devs, resourceapi.Device{Name: fmt.Sprintf("gpu-%d-mig-1g10gb-19-%d", i, start), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"type": str("mig"), "profile": str("1g.10gb"), "resource.kubernetes.io/pciBusID": str(bus)}})
		}
	}
	return devs
}

func slice(node string, devs ...resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-" + driver}, Spec: resourceapi.ResourceSliceSpec{
		Driver: driver, NodeName: &node, Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}, Devices: devs}}
}

func claim(ns, name string, reservedFor []string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if results != nil {
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	}
	for _, p := range reservedFor {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p, UID: types.UID(p)})
	}
	return c
}

func result(node, device string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: driver, Pool: node, Device: device}
}

func pod(ns, name string, phase corev1.PodPhase, claims ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Status: corev1.PodStatus{Phase: phase}}
	for _, c := range claims {
		p.Status.ResourceClaimStatuses = append(p.Status.ResourceClaimStatuses, corev1.PodResourceClaimStatus{Name: "gpu", ResourceClaimName: ptr.To(c)})
	}
	return p
}

func node(name string, ready corev1.ConditionStatus, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{Taints: taints},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready}}}}
}

// TestBuild: objects in, the page's model out.
func TestBuild(t *testing.T) {
	shareID := types.UID("share-1")
	for _, tc := range []struct {
		name  string
		in    Objects
		check func(t *testing.T, f Fleet)
	}{{
		name: "no slices: nodes without GPUs",
		in:   Objects{Nodes: []*corev1.Node{node("b", corev1.ConditionTrue), node("a", corev1.ConditionFalse)}},
		check: func(t *testing.T, f Fleet) {
			want := []Node{{Name: "a", Ready: "False"}, {Name: "b", Ready: "True"}}
			if f.Slices != 0 || !reflect.DeepEqual(f.Nodes, want) {
				t.Errorf("got %d slices, nodes %+v; want 0, %+v", f.Slices, f.Nodes, want)
			}
		},
	}, {
		name: "a GPU, its VFIO device and MIG placements; free ones counted",
		in: Objects{Slices: []*resourceapi.ResourceSlice{slice("n1", append(gpuDevices(1, true), gpuDevices(0, true)...)...)},
			Claims: []*resourceapi.ResourceClaim{claim("ml", "mig-claim", []string{"trainer"}, result("n1", "gpu-1-mig-1g10gb-19-1"))},
			Pods:   []*corev1.Pod{pod("ml", "trainer", corev1.PodRunning)}},
		check: func(t *testing.T, f Fleet) {
			if len(f.Nodes) != 1 || len(f.Nodes[0].GPUs) != 2 {
				t.Fatalf("want 1 node with 2 GPUs, got %+v", f.Nodes)
			}
			g0, g1 := f.Nodes[0].GPUs[0], f.Nodes[0].GPUs[1]
			if g0.Name != "gpu-0" || g1.Name != "gpu-1" || g0.UUID != "GPU-0" || g0.Product != "NVIDIA H100" || g0.Memory != "80Gi" {
				t.Errorf("GPUs out of order or incomplete: %+v, %+v", g0, g1)
			}
			if g0.MIGFree != 2 || len(g0.MIG) != 0 || g1.MIGFree != 1 || len(g1.MIG) != 1 {
				t.Errorf("MIG: gpu-0 %d free %v, gpu-1 %d free %v; want 2 free none, 1 free one held", g0.MIGFree, g0.MIG, g1.MIGFree, g1.MIG)
			}
			want := []Holder{{Claim: "ml/mig-claim", Request: "gpu", Pods: []PodRef{{Name: "ml/trainer", Phase: "Running"}}}}
			if !reflect.DeepEqual(g1.MIG[0].Holders, want) || g1.MIG[0].Name != "gpu-1-mig-1g10gb-19-1" {
				t.Errorf("MIG device %+v, want holders %+v", g1.MIG[0], want)
			}
			if g0.VFIO == nil || g0.VFIO.Name != "gpu-vfio-0" || len(g0.Holders) != 0 {
				t.Errorf("gpu-0: VFIO %+v, holders %+v", g0.VFIO, g0.Holders)
			}
		},
	}, {
		name: "shares of one GPU, pods from reservedFor and from pod status, once each",
		in: Objects{Slices: []*resourceapi.ResourceSlice{slice("n1", gpuDevices(0, false)...)},
			Claims: []*resourceapi.ResourceClaim{
				claim("a", "s1", []string{"p1"}, resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: driver, Pool: "n1", Device: "gpu-0",
					ShareID: &shareID, ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi")}}),
				claim("a", "s2", nil, result("n1", "gpu-0")),
				claim("a", "pending", nil),
			},
			Pods: []*corev1.Pod{pod("a", "p1", corev1.PodRunning, "s1"), pod("a", "p2", corev1.PodPending, "s2")}},
		check: func(t *testing.T, f Fleet) {
			g := f.Nodes[0].GPUs[0]
			want := []Holder{
				{Claim: "a/s1", Request: "gpu", ShareID: "share-1", Consumed: map[string]string{"memory": "10Gi"}, Pods: []PodRef{{Name: "a/p1", Phase: "Running"}}},
				{Claim: "a/s2", Request: "gpu", Pods: []PodRef{{Name: "a/p2", Phase: "Pending"}}},
			}
			if !reflect.DeepEqual(g.Holders, want) {
				t.Errorf("holders\n got %+v\nwant %+v", g.Holders, want)
			}
		},
	}, {
		name: "a claim of a PodGroup: the group, and its pods that name the claim",
		in: Objects{Slices: []*resourceapi.ResourceSlice{slice("n1", gpuDevices(0, false)...)},
			Claims: []*resourceapi.ResourceClaim{func() *resourceapi.ResourceClaim {
				c := claim("ml", "group-gpu", nil, result("n1", "gpu-0"))
				c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{APIGroup: "scheduling.k8s.io", Resource: "podgroups", Name: "trainers", UID: "pg"}}
				return c
			}()},
			Pods: []*corev1.Pod{pod("ml", "trainer-0", corev1.PodRunning, "group-gpu"), pod("ml", "trainer-1", corev1.PodRunning, "group-gpu")}},
		check: func(t *testing.T, f Fleet) {
			want := []Holder{{Claim: "ml/group-gpu", Request: "gpu", PodGroups: []string{"ml/trainers"},
				Pods: []PodRef{{Name: "ml/trainer-0", Phase: "Running"}, {Name: "ml/trainer-1", Phase: "Running"}}}}
			if got := f.Nodes[0].GPUs[0].Holders; !reflect.DeepEqual(got, want) {
				t.Errorf("holders\n got %+v\nwant %+v", got, want)
			}
		},
	}, {
		name: "health taints in the slice, DeviceTaintRules by device, node taints",
		in: Objects{
			Nodes: []*corev1.Node{node("n1", corev1.ConditionTrue, corev1.Taint{Key: "maintenance", Effect: corev1.TaintEffectNoSchedule})},
			Slices: []*resourceapi.ResourceSlice{slice("n1", func() []resourceapi.Device {
				d := gpuDevices(0, false)
				d[0].Taints = []resourceapi.DeviceTaint{{Key: driver + "/xid", Value: "79", Effect: resourceapi.DeviceTaintEffectNoSchedule}}
				d[1].Taints = d[0].Taints
				return append(d, gpuDevices(1, false)...)
			}()...)},
			TaintRules: []*resourceapi.DeviceTaintRule{
				{ObjectMeta: metav1.ObjectMeta{Name: "drain-gpu-1"}, Spec: resourceapi.DeviceTaintRuleSpec{
					DeviceSelector: &resourceapi.DeviceTaintSelector{Driver: ptr.To(driver), Pool: ptr.To("n1"), Device: ptr.To("gpu-1")},
					Taint:          resourceapi.DeviceTaint{Key: "example.com/drain", Effect: resourceapi.DeviceTaintEffectNoExecute}}},
				{ObjectMeta: metav1.ObjectMeta{Name: "other-pool"}, Spec: resourceapi.DeviceTaintRuleSpec{
					DeviceSelector: &resourceapi.DeviceTaintSelector{Pool: ptr.To("n2")},
					Taint:          resourceapi.DeviceTaint{Key: "example.com/x", Effect: resourceapi.DeviceTaintEffectNoSchedule}}},
			}},
		check: func(t *testing.T, f Fleet) {
			n := f.Nodes[0]
			if want := []Taint{{Key: "maintenance", Effect: "NoSchedule"}}; !reflect.DeepEqual(n.Taints, want) || n.Ready != "True" {
				t.Errorf("node taints %+v ready %q, want %+v True", n.Taints, n.Ready, want)
			}
			g0, g1 := n.GPUs[0], n.GPUs[1]
			if want := []Taint{{Key: driver + "/xid", Value: "79", Effect: "NoSchedule"}}; g0.Health != HealthUnhealthy || !reflect.DeepEqual(g0.Taints, want) {
				t.Errorf("gpu-0 health %q taints %+v, want unhealthy %+v (once)", g0.Health, g0.Taints, want)
			}
			if want := []Taint{{Key: "example.com/drain", Effect: "NoExecute", Rule: "drain-gpu-1"}}; g1.Health != HealthOK || !reflect.DeepEqual(g1.Taints, want) {
				t.Errorf("gpu-1 health %q taints %+v, want ok %+v", g1.Health, g1.Taints, want)
			}
		},
	}, {
		name: "other drivers' slices and results are left out",
		in: Objects{Slices: []*resourceapi.ResourceSlice{func() *resourceapi.ResourceSlice {
			s := slice("n1", gpuDevices(0, false)...)
			s.Spec.Driver = "other.example.com"
			return s
		}()}},
		check: func(t *testing.T, f Fleet) {
			if f.Slices != 0 || len(f.Nodes) != 0 {
				t.Errorf("got %d slices, %+v", f.Slices, f.Nodes)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Driver = driver
			f := Build(tc.in)
			tc.check(t, f)
			// The same objects in another order build the same model.
			rev := tc.in
			rev.Slices, rev.Claims, rev.Pods, rev.Nodes = slices.Clone(rev.Slices), slices.Clone(rev.Claims), slices.Clone(rev.Pods), slices.Clone(rev.Nodes)
			slices.Reverse(rev.Slices)
			slices.Reverse(rev.Claims)
			slices.Reverse(rev.Pods)
			slices.Reverse(rev.Nodes)
			a, _ := json.Marshal(f)
			b, _ := json.Marshal(Build(rev))
			if string(a) != string(b) {
				t.Errorf("input order changes the model:\n%s\n%s", a, b)
			}
		})
	}
}

func TestCompareNames(t *testing.T) {
	names := []string{"gpu-10", "gpu-2", "gpu-1", "node-b", "gpu-02x", "node-a"}
	slices.SortFunc(names, compareNames)
	want := []string{"gpu-1", "gpu-2", "gpu-02x", "gpu-10", "node-a", "node-b"}
	if !slices.Equal(names, want) {
		t.Errorf("got %v, want %v", names, want)
	}
}

// TestTransformsKeepWhatTheModelReads: a slice, claim and pod trimmed by
// the informers' transforms build the same model as the full objects.
func TestTransformsKeepWhatTheModelReads(t *testing.T) {
	s := slice("n1", gpuDevices(0, true)...)
	s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "x"}}
	s.Spec.Devices[0].Attributes["cudaDriverVersion"] = str("13.0")
	c := claim("a", "c", []string{"p"}, result("n1", "gpu-0"))
	p := pod("a", "p", corev1.PodRunning, "c")
	p.Spec.Containers = []corev1.Container{{Name: "main", Image: "x"}}
	n := node("n1", corev1.ConditionTrue)
	full := Build(Objects{Driver: driver, Slices: []*resourceapi.ResourceSlice{s.DeepCopy()}, Claims: []*resourceapi.ResourceClaim{c.DeepCopy()}, Pods: []*corev1.Pod{p.DeepCopy()}, Nodes: []*corev1.Node{n.DeepCopy()}})
	ts, _ := trimSlice(s)
	tc, _ := trimClaim(c)
	tp, _ := trimPod(p)
	tn, _ := trimNode(n)
	trimmed := Build(Objects{Driver: driver, Slices: []*resourceapi.ResourceSlice{ts.(*resourceapi.ResourceSlice)}, Claims: []*resourceapi.ResourceClaim{tc.(*resourceapi.ResourceClaim)}, Pods: []*corev1.Pod{tp.(*corev1.Pod)}, Nodes: []*corev1.Node{tn.(*corev1.Node)}})
	if !reflect.DeepEqual(full, trimmed) {
		t.Errorf("trimmed objects build another model:\n%+v\n%+v", full, trimmed)
	}
	if len(s.ManagedFields) != 0 || len(s.Spec.Devices[0].Attributes) != 5 || len(p.Spec.Containers) != 0 {
		t.Errorf("not trimmed: %d managed fields, %d attributes, %d containers", len(s.ManagedFields), len(s.Spec.Devices[0].Attributes), len(p.Spec.Containers))
	}
}

// fleet1000 is 1,000 nodes of 8 GPUs (full GPU and VFIO device each),
// half of the GPUs held by a claim with a running pod.
func fleet1000() Objects {
	in := Objects{Driver: driver}
	for i := range 1000 {
		name := fmt.Sprintf("node-%04d", i)
		in.Nodes = append(in.Nodes, node(name, corev1.ConditionTrue))
		var devs []resourceapi.Device
		for g := range 8 {
			devs = append(devs, gpuDevices(g, false)...)
			if g%2 == 0 {
				cn := fmt.Sprintf("c-%d-%d", i, g)
				in.Claims = append(in.Claims, claim("ml", cn, []string{cn}, result(name, fmt.Sprintf("gpu-%d", g))))
				in.Pods = append(in.Pods, pod("ml", cn, corev1.PodRunning, cn))
			}
		}
		in.Slices = append(in.Slices, slice(name, devs...))
	}
	return in
}

// BenchmarkBuild1000Nodes: one rebuild of the model of [fleet1000].
func BenchmarkBuild1000Nodes(b *testing.B) {
	in := fleet1000()
	b.ReportAllocs()
	for b.Loop() {
		f := Build(in)
		if len(f.Nodes) != 1000 {
			b.Fatalf("%d nodes", len(f.Nodes))
		}
	}
}

// BenchmarkRebuildAndDelta1000Nodes: what the server does after a change
// at 1,000 nodes: rebuild the model, encode each node, compare with the
// last model and encode the delta (one pod's phase changes each time).
func BenchmarkRebuildAndDelta1000Nodes(b *testing.B) {
	in := fleet1000()
	h := newHub()
	if _, err := h.publishFleet(Build(in)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		p := in.Pods[i%len(in.Pods)]
		i++
		if p.Status.Phase == corev1.PodRunning {
			p.Status.Phase = corev1.PodPending
		} else {
			p.Status.Phase = corev1.PodRunning
		}
		changed, err := h.publishFleet(Build(in))
		if err != nil || changed != 1 {
			b.Fatalf("changed %d nodes (%v), want 1", changed, err)
		}
	}
}
