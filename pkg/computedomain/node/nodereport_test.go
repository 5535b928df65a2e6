package node

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/computedomain"
)

// applyConfigMaps is a ConfigMap store with the API server's server-side
// apply ownership of data keys, which client-go's fake tracker does not
// check under concurrency: an apply without force that sets a key another
// field manager holds to another value is a conflict; keys of different
// managers never conflict.
type applyConfigMaps struct {
	mu      sync.Mutex
	objs    map[string]*corev1.ConfigMap
	owners  map[string]string // name/key -> field manager
	applies int
	fails   int
	// firstReads, if set, holds each of the first firstReads reads until
	// all of them have arrived, so that the nodes start from one view (as
	// nodes racing against a real API server do) and some must collide:
	// without it, goroutines that happen to run one after the other never
	// conflict and the test would not exercise the retry.
	firstReads int
	reads      int
	allRead    chan struct{}
}

// readDone is called by gatedConfigMaps after each read: the first
// firstReads reads wait there until all of them have arrived. (The fake
// clientset runs its reactors under one lock, so the wait cannot be in
// the reactor.)
func (s *applyConfigMaps) readDone() {
	s.mu.Lock()
	s.reads++
	held := s.reads <= s.firstReads
	if s.reads == s.firstReads {
		close(s.allRead)
	}
	s.mu.Unlock()
	if held {
		<-s.allRead
	}
}

// gatedClient is a clientset whose ConfigMaps' reads go through
// applyConfigMaps.readDone once they have read.
type gatedClient struct {
	*fake.Clientset
	store *applyConfigMaps
}

func (c gatedClient) CoreV1() corev1client.CoreV1Interface {
	return gatedCore{CoreV1Interface: c.Clientset.CoreV1(), store: c.store}
}

type gatedCore struct {
	corev1client.CoreV1Interface
	store *applyConfigMaps
}

func (c gatedCore) ConfigMaps(namespace string) corev1client.ConfigMapInterface {
	return gatedConfigMaps{ConfigMapInterface: c.CoreV1Interface.ConfigMaps(namespace), store: c.store}
}

type gatedConfigMaps struct {
	corev1client.ConfigMapInterface
	store *applyConfigMaps
}

func (c gatedConfigMaps) Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.ConfigMap, error) {
	cm, err := c.ConfigMapInterface.Get(ctx, name, opts)
	c.store.readDone()
	return cm, err
}

func (s *applyConfigMaps) install(c *fake.Clientset) {
	s.objs = map[string]*corev1.ConfigMap{}
	s.owners = map[string]string{}
	s.allRead = make(chan struct{})
	gr := schema.GroupResource{Resource: "configmaps"}
	c.PrependReactor("*", "configmaps", func(a k8stesting.Action) (bool, runtime.Object, error) {
		switch a.GetVerb() {
		case "get":
			name := a.(k8stesting.GetAction).GetName()
			s.mu.Lock()
			cm, ok := s.objs[name]
			if ok {
				cm = cm.DeepCopy()
			}
			s.mu.Unlock()
			if !ok {
				return true, nil, apierrors.NewNotFound(gr, name)
			}
			return true, cm, nil
		case "patch":
			a := a.(k8stesting.PatchActionImpl)
			if a.GetPatchType() != types.ApplyPatchType {
				return true, nil, apierrors.NewBadRequest("only apply is served")
			}
			if a.PatchOptions.Force != nil && *a.PatchOptions.Force {
				return true, nil, apierrors.NewBadRequest("the registry must never be applied with force")
			}
			applied := &corev1.ConfigMap{}
			if err := json.Unmarshal(a.GetPatch(), applied); err != nil {
				return true, nil, apierrors.NewBadRequest(err.Error())
			}
			manager := a.PatchOptions.FieldManager
			s.mu.Lock()
			defer s.mu.Unlock()
			cm, ok := s.objs[a.GetName()]
			if !ok {
				cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: a.GetName(), Namespace: a.GetNamespace()}, Data: map[string]string{}}
			}
			for k, v := range applied.Data {
				if owner := s.owners[a.GetName()+"/"+k]; owner != "" && owner != manager && cm.Data[k] != v {
					s.fails++
					return true, nil, apierrors.NewApplyConflict([]metav1.StatusCause{{Type: metav1.CauseTypeFieldManagerConflict, Field: ".data." + k,
						Message: fmt.Sprintf("conflict with %q", owner)}}, "Apply failed with 1 conflict")
				}
			}
			for k, v := range applied.Data {
				cm.Data[k] = v
				s.owners[a.GetName()+"/"+k] = manager
			}
			s.applies++
			s.objs[a.GetName()] = cm
			return true, cm.DeepCopy(), nil
		}
		return true, nil, apierrors.NewBadRequest("the registry is only read and applied, not " + a.GetVerb())
	})
}

func TestIndexRegistryDistinctUnderContention(t *testing.T) {
	for _, nodes := range []int{2, 18, 36} {
		t.Run(strconv.Itoa(nodes), func(t *testing.T) {
			kube := fake.NewClientset()
			store := &applyConfigMaps{firstReads: nodes}
			store.install(kube)
			reg := &IndexRegistry{Client: gatedClient{Clientset: kube, store: store}, Namespace: "gpudra", MaxNodes: nodes,
				Backoff: wait.Backoff{Duration: time.Millisecond, Factor: 1.5, Jitter: 1, Steps: 200, Cap: 20 * time.Millisecond}}
			const clique = "2F6A1D3C-0000-4000-8000-000000000001.1"
			got := make([]int, nodes)
			errs := make([]error, nodes)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range nodes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					got[i], errs[i] = reg.Take(context.Background(), clique, fmt.Sprintf("node-%02d", i))
				}()
			}
			close(start)
			wg.Wait()
			seen := map[int]string{}
			for i := range nodes {
				if errs[i] != nil {
					t.Fatalf("node-%02d: %v", i, errs[i])
				}
				if got[i] < 0 || got[i] >= nodes {
					t.Errorf("node-%02d got index %d, outside 0..%d", i, got[i], nodes-1)
				}
				if other, dup := seen[got[i]]; dup {
					t.Errorf("node-%02d and %s share index %d", i, other, got[i])
				}
				seen[got[i]] = fmt.Sprintf("node-%02d", i)
			}
			// An index never changes: taking it again returns the same.
			for i := range nodes {
				again, err := reg.Take(context.Background(), clique, fmt.Sprintf("node-%02d", i))
				if err != nil || again != got[i] {
					t.Errorf("node-%02d again: %d, %v; want %d", i, again, err, got[i])
				}
			}
			t.Logf("%d nodes: %d applies, %d conflicts", nodes, store.applies, store.fails)
			// Every node read the empty registry first (firstReads), so two
			// nodes whose names pick the same index from it collide, and
			// one of them must have retried.
			all := make([]int, nodes)
			for i := range all {
				all[i] = i
			}
			picks := map[int]bool{}
			for i := range nodes {
				picks[pickIndex(fmt.Sprintf("node-%02d", i), all)] = true
			}
			if collide := len(picks) < nodes; collide != (store.fails > 0) {
				t.Errorf("%d distinct first picks of %d nodes, %d conflicts: a collision must cost a conflict, and only a collision", len(picks), nodes, store.fails)
			}
			if store.applies != nodes {
				t.Errorf("%d applies for %d nodes: a node wrote more than its one key", store.applies, nodes)
			}
			// The clique is full: one more node is refused, naming the flag.
			_, err := reg.Take(context.Background(), clique, "one-too-many")
			if err == nil || !strings.Contains(err.Error(), "--imex-max-nodes") {
				t.Errorf("a node past MaxNodes: %v", err)
			}
		})
	}
}

func TestRegistryName(t *testing.T) {
	if got := RegistryName("ABC.1"); got != "gpudra-imex-indices.abc.1" {
		t.Errorf("RegistryName = %q", got)
	}
	if got := RegistryName("bad/clique"); !strings.HasPrefix(got, IndexRegistryPrefix) || strings.Contains(got, "/") {
		t.Errorf("RegistryName of an invalid name = %q", got)
	}
}

// cliqueRecorder fakes the ComputeDomainClique API for a reporter: it
// records every patch and answers gets from objs.
type cliqueRecorder struct {
	mu      sync.Mutex
	patches []k8stesting.PatchActionImpl
	objs    map[string]*unstructured.Unstructured
}

func (r *cliqueRecorder) install(dyn *dynamicfake.FakeDynamicClient) {
	r.objs = map[string]*unstructured.Unstructured{}
	dyn.PrependReactor("patch", "computedomaincliques", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		p := a.(k8stesting.PatchActionImpl)
		r.patches = append(r.patches, p)
		if p.GetPatchType() == types.JSONPatchType {
			if _, ok := r.objs[p.GetName()]; !ok {
				return true, nil, apierrors.NewNotFound(computedomain.CliqueGVR.GroupResource(), p.GetName())
			}
		}
		u := &unstructured.Unstructured{}
		u.SetName(p.GetName())
		return true, u, nil
	})
	dyn.PrependReactor("get", "computedomaincliques", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		name := a.(k8stesting.GetAction).GetName()
		if u, ok := r.objs[name]; ok {
			return true, u.DeepCopy(), nil
		}
		return true, nil, apierrors.NewNotFound(computedomain.CliqueGVR.GroupResource(), name)
	})
}

func (r *cliqueRecorder) taken() []k8stesting.PatchActionImpl {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.patches
	r.patches = nil
	return out
}

func TestNodeReporterWritesOnlyItsOwnEntryWhenChanged(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	kube := fake.NewClientset()
	(&applyConfigMaps{}).install(kube)
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{computedomain.CliqueGVR: "ComputeDomainCliqueList"})
	rec := &cliqueRecorder{}
	rec.install(dyn)
	r := NewReporter(ReporterConfig{
		Dynamic: dyn, Namespace: "gpudra", NodeName: "node-b", NodeIP: "10.0.0.2",
		Indices: &IndexRegistry{Client: kube, Namespace: "gpudra", MaxNodes: 18},
	})
	const clique = "cluster.1"
	// node-a took an index first.
	indexA, err := r.cfg.Indices.Take(ctx, clique, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	indexB := -1

	applied := func(step string, want v1beta1.ComputeDomainStatusValue) {
		t.Helper()
		ps := rec.taken()
		if len(ps) != 1 || ps[0].GetPatchType() != types.ApplyPatchType || ps[0].PatchOptions.FieldManager != "gpudra-node-node-b" ||
			ps[0].PatchOptions.Force == nil || !*ps[0].PatchOptions.Force || ps[0].GetName() != "uid-a."+clique {
			t.Fatalf("%s: want one forced apply of uid-a.%s by gpudra-node-node-b, got %+v", step, clique, ps)
		}
		var body v1beta1.ComputeDomainClique
		if err := json.Unmarshal(ps[0].GetPatch(), &body); err != nil {
			t.Fatal(err)
		}
		wantEntry := v1beta1.ComputeDomainDaemonInfo{NodeName: "node-b", IPAddress: "10.0.0.2", CliqueID: clique, Index: indexB, Status: want}
		if len(body.Daemons) != 1 || *body.Daemons[0] != wantEntry {
			t.Fatalf("%s: applied daemons %+v, want only %+v", step, body.Daemons, wantEntry)
		}
	}

	if err := r.Join(ctx, "uid-a", clique); err != nil {
		t.Fatal(err)
	}
	if indexB, err = r.cfg.Indices.Take(ctx, clique, "node-b"); err != nil || indexB == indexA {
		t.Fatalf("node-b's index %d (%v): want one of its own, node-a has %d", indexB, err, indexA)
	}
	applied("join", v1beta1.ComputeDomainStatusNotReady)
	if err := r.Join(ctx, "uid-a", clique); err != nil {
		t.Fatal(err)
	}
	if ps := rec.taken(); len(ps) != 0 {
		t.Fatalf("a second join with nothing changed wrote %d patches", len(ps))
	}
	r.SetReady(true)
	if err := r.report(ctx, "uid-a"); err != nil {
		t.Fatal(err)
	}
	applied("ready", v1beta1.ComputeDomainStatusReady)

	// Leaving: a JSON patch that tests the entry is the node's.
	other := map[string]any{"nodeName": "node-a", "ipAddress": "10.0.0.1", "cliqueID": clique, "index": int64(0)}
	mine := map[string]any{"nodeName": "node-b", "ipAddress": "10.0.0.2", "cliqueID": clique, "index": int64(1)}
	rec.objs["uid-a."+clique] = &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "uid-a." + clique}, "daemons": []any{other, mine}}}
	if err := r.Leave(ctx, "uid-a"); err != nil {
		t.Fatal(err)
	}
	ps := rec.taken()
	if len(ps) != 1 || ps[0].GetPatchType() != types.JSONPatchType {
		t.Fatalf("leave: want one JSON patch, got %+v", ps)
	}
	var ops []map[string]any
	if err := json.Unmarshal(ps[0].GetPatch(), &ops); err != nil {
		t.Fatal(err)
	}
	if len(ops) != 2 || ops[0]["op"] != "test" || ops[0]["path"] != "/daemons/1/nodeName" || ops[0]["value"] != "node-b" ||
		ops[1]["op"] != "remove" || ops[1]["path"] != "/daemons/1" {
		t.Fatalf("leave patch %s", ps[0].GetPatch())
	}

	// A clique the controller deleted is not created again by leaving.
	if err := r.Join(ctx, "uid-gone", clique); err != nil {
		t.Fatal(err)
	}
	rec.taken()
	if err := r.Leave(ctx, "uid-gone"); err != nil {
		t.Fatal(err)
	}
	if ps := rec.taken(); len(ps) != 0 {
		t.Fatalf("leaving a deleted clique wrote %+v", ps)
	}
}

func TestIndexRegistryData(t *testing.T) {
	tests := []struct {
		name     string
		data     map[string]string
		node     string
		max      int
		wantHeld int
		wantFree []int
		wantErr  string
	}{
		{name: "empty", node: "n1", max: 3, wantHeld: -1, wantFree: []int{0, 1, 2}},
		{name: "held", data: map[string]string{"0": "n0", "2": "n1"}, node: "n1", max: 3, wantHeld: 2, wantFree: []int{1}},
		{name: "others", data: map[string]string{"1": "n0"}, node: "n1", max: 3, wantHeld: -1, wantFree: []int{0, 2}},
		{name: "not an index", data: map[string]string{"n0": "0"}, node: "n1", max: 3, wantErr: `key "n0" is not an IMEX index`},
		{name: "negative", data: map[string]string{"-1": "n0"}, node: "n1", max: 3, wantErr: `key "-1" is not an IMEX index`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			held, free, err := indicesOf(tt.data, tt.node, tt.max)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || held != tt.wantHeld || !slices.Equal(free, tt.wantFree) {
				t.Errorf("indicesOf = %d, %v, %v; want %d, %v", held, free, err, tt.wantHeld, tt.wantFree)
			}
		})
	}
	// Nodes racing from one view mostly try different indices.
	free := []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17}
	picks := map[int]bool{}
	for i := range 18 {
		picks[pickIndex(fmt.Sprintf("node-%02d", i), free)] = true
	}
	if len(picks) < 6 {
		t.Errorf("18 nodes picked only %d distinct indices of 18 from one view", len(picks))
	}
}
