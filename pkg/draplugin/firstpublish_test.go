package draplugin_test

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpudra/gpudra/pkg/draplugin"
)

// sliceCalls records the ResourceSlice calls a fake API server gets, dry
// runs apart, with when each came.
type sliceCalls struct {
	mu    sync.Mutex
	calls []sliceCall
}

type sliceCall struct {
	verb   string
	dryRun bool
	at     time.Time
	slice  *resourceapi.ResourceSlice
}

// record installs the recorder on client, ahead of every reactor added
// before it (so it sees what the plugin sent).
func (r *sliceCalls) record(client *fake.Clientset) {
	client.PrependReactor("*", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		c := sliceCall{verb: a.GetVerb(), dryRun: isDryRun(a), at: time.Now()}
		if a, ok := a.(k8stesting.CreateAction); ok {
			c.slice, _ = a.GetObject().(*resourceapi.ResourceSlice)
			c.slice = c.slice.DeepCopy()
		}
		r.mu.Lock()
		r.calls = append(r.calls, c)
		r.mu.Unlock()
		return false, nil, nil
	})
}

// count returns how many calls of verb came, dry runs left out.
func (r *sliceCalls) count(verb string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		if c.verb == verb && !c.dryRun {
			n++
		}
	}
	return n
}

func (r *sliceCalls) snapshot() []sliceCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sliceCall(nil), r.calls...)
}

func (r *sliceCalls) reset() {
	r.mu.Lock()
	r.calls = nil
	r.mu.Unlock()
}

// withSliceCalls gives the plugin a fake API server that records its
// ResourceSlice calls in r; more reactors go before it.
func withSliceCalls(r *sliceCalls, node string, reactors ...func(*fake.Clientset)) func(*draplugin.Config) {
	return func(cfg *draplugin.Config) {
		client := newFakeClient(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}})
		for _, add := range reactors {
			add(client)
		}
		r.record(client)
		cfg.KubeClient = client
	}
}

// TestFirstPublicationByThePlugin: the plugin creates its slices itself
// before the ResourceSlice controller's informer has synced, and the
// controller, once synced, finds them up to date: one create per slice
// and nothing else, also after a restart over the same API server, where
// the plugin leaves the slices to the controller.
func TestFirstPublicationByThePlugin(t *testing.T) {
	var calls sliceCalls
	start := time.Now()
	h := newMIGHarness(t, withSliceCalls(&calls, "mig-0"))
	list := func() []resourceapi.ResourceSlice {
		l, err := h.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return l.Items
	}
	// The controller syncs the pool at once when its informer synced,
	// which Start waited for; a sync that would change something has
	// done so well within a second.
	time.Sleep(time.Second)
	slices := list()
	if len(slices) < 2 {
		t.Fatalf("%d slices published, want a pool of several (counter sets and devices)", len(slices))
	}
	if c, u, d := calls.count("create"), calls.count("update"), calls.count("delete"); c != len(slices) || u != 0 || d != 0 {
		t.Errorf("%d creates, %d updates, %d deletes for %d slices; want one create each and nothing else", c, u, d, len(slices))
	}
	// The creates came before the controller's informer listed: the
	// plugin's own list, then the creates, then the informer's.
	lists := 0
	var firstCreate time.Time
	for _, c := range calls.snapshot() {
		switch {
		case c.verb == "list":
			lists++
		case c.verb == "create" && !c.dryRun:
			if lists != 1 {
				t.Errorf("a slice created after %d lists; want all after the plugin's own and before the informer's", lists)
			}
			if firstCreate.IsZero() {
				firstCreate = c.at
			}
		}
	}
	t.Logf("first slice created %v after the plugin started", firstCreate.Sub(start))
	for _, s := range slices {
		if s.Spec.Pool.Generation != 1 || len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != "node-uid" {
			t.Errorf("slice %s: generation %d, owners %+v; want generation 1 owned by the Node", s.Name, s.Spec.Pool.Generation, s.OwnerReferences)
		}
	}

	calls.reset()
	h.restart()
	time.Sleep(time.Second)
	if c, u, d := calls.count("create"), calls.count("update"), calls.count("delete"); c != 0 || u != 0 || d != 0 {
		t.Errorf("after a restart: %d creates, %d updates, %d deletes; want none (the slices are up to date)", c, u, d)
	}
	if n := len(list()); n != len(slices) {
		t.Errorf("after a restart: %d slices, want %d", n, len(slices))
	}
}

// TestFeatureProbeFallsBackBeforePublishing: where the API server drops
// counters, the plugin learns it from its dry-run probe and publishes
// static MIG from the start: no slice with counters is ever created, the
// Node event says why, and the ResourceSlice controller never meets a
// dropped field (nothing is updated).
func TestFeatureProbeFallsBackBeforePublishing(t *testing.T) {
	var calls sliceCalls
	h := newMIGHarness(t, withSliceCalls(&calls, "mig-0", dropCounters))
	if _, err := h.waitForEvent("DynamicMIGUnavailable"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the controller's sync
	probes := 0
	for _, c := range calls.snapshot() {
		if c.verb != "create" {
			continue
		}
		if c.dryRun {
			probes++
			continue
		}
		if probes == 0 {
			t.Error("a slice was created before the probe")
		}
		if len(c.slice.Spec.SharedCounters) > 0 {
			t.Errorf("slice %s created with counter sets", c.slice.GenerateName)
		}
		for _, d := range c.slice.Spec.Devices {
			if len(d.ConsumesCounters) > 0 {
				t.Errorf("device %s created consuming counters", d.Name)
			}
		}
	}
	if probes != 1 || calls.count("create") == 0 || calls.count("update") != 0 {
		t.Errorf("%d probes, %d creates, %d updates; want one probe, creates, and no update", probes, calls.count("create"), calls.count("update"))
	}
}

// TestFeatureProbeFailureIsNotFatal: a probe the API server refuses
// (RBAC) leaves the plugin publishing as configured.
func TestFeatureProbeFailureIsNotFatal(t *testing.T) {
	var calls sliceCalls
	refuseDryRun := func(client *fake.Clientset) {
		client.PrependReactor("create", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if isDryRun(a) {
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceslices"}, "", nil)
			}
			return false, nil, nil
		})
	}
	h := newMIGHarness(t, withSliceCalls(&calls, "mig-0", refuseDryRun))
	counters := false
	for _, d := range h.driver.Devices() {
		counters = counters || len(d.ConsumesCounters) > 0
	}
	if !counters {
		t.Error("after a refused probe the plugin publishes no dynamic MIG devices; want them, as configured")
	}
}

// TestChannelPluginProbesConsumableCapacity: the ComputeDomain channel
// plugin runs the same shell, so where the API server drops
// allowMultipleAllocations it publishes channel-0 for one claim at a time
// from its first slice on, and says so.
func TestChannelPluginProbesConsumableCapacity(t *testing.T) {
	var calls sliceCalls
	dropShared := func(client *fake.Clientset) {
		client.PrependReactor("create", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
			s := a.(k8stesting.CreateAction).GetObject().(*resourceapi.ResourceSlice).DeepCopy()
			for i := range s.Spec.Devices {
				s.Spec.Devices[i].AllowMultipleAllocations = nil
			}
			if isDryRun(a) {
				return true, s, nil
			}
			return false, nil, nil
		})
	}
	h := newCDHarnessWith(t, nil, withSliceCalls(&calls, "gb200-nvl72-00", dropShared))
	if _, err := h.waitForEvent("SharedChannelUnavailable"); err != nil {
		t.Fatal(err)
	}
	creates := 0
	for _, c := range calls.snapshot() {
		if c.verb != "create" || c.dryRun {
			continue
		}
		creates++
		for _, d := range c.slice.Spec.Devices {
			if d.AllowMultipleAllocations != nil {
				t.Errorf("device %s created with allowMultipleAllocations", d.Name)
			}
		}
	}
	if creates == 0 {
		t.Error("no slice created")
	}
}

// BenchmarkStartToSlices reports, over a fake API server, the time from
// draplugin.Start to the first ResourceSlice created (ms-to-slices) and to
// Start returning (ms-to-start), for the dgx-h100 node.
// localcluster/test/preparebench has the same against a real API server.
func BenchmarkStartToSlices(b *testing.B) {
	var toSlices, toStart time.Duration
	n := 0
	for b.Loop() {
		var calls sliceCalls
		var start time.Time
		h := newHarness(b, withSliceCalls(&calls, nodeName), func(*draplugin.Config) { start = time.Now() })
		toStart += time.Since(start)
		created := time.Time{}
		for deadline := time.Now().Add(10 * time.Second); created.IsZero(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				b.Fatal("no ResourceSlice created within 10 s")
			}
			for _, c := range calls.snapshot() {
				if c.verb == "create" && !c.dryRun {
					created = c.at
					break
				}
			}
		}
		toSlices += created.Sub(start)
		n++
		b.StopTimer()
		h.stop()
		b.StartTimer()
	}
	b.ReportMetric(float64(toSlices.Microseconds())/1000/float64(n), "ms-to-slices")
	b.ReportMetric(float64(toStart.Microseconds())/1000/float64(n), "ms-to-start")
}
