package fleetview

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Resource states, as the page shows them.
const (
	StateWaiting   = "waiting"
	StateSynced    = "synced"
	StateForbidden = "forbidden"
	// StateNotServed: the API server does not serve the resource (e.g.
	// DeviceTaintRules on a cluster without device taints).
	StateNotServed = "not served"
	StateError     = "error"
)

// ResourceStatus is how reading one resource goes.
type ResourceStatus struct {
	// Resource is the plural resource name, with its group:
	// resourceslices.resource.k8s.io, nodes.
	Resource string `json:"resource"`
	State    string `json:"state"`
	// Verb is the verb refused (list or watch) when forbidden.
	Verb    string `json:"verb,omitempty"`
	Message string `json:"message,omitempty"`
}

// watched is one watched resource: its informer and how reading it goes.
type watched struct {
	name     string
	informer cache.SharedIndexInformer

	mu     sync.Mutex
	status ResourceStatus
	// setBy is the call (list or watch) whose outcome status is: a watch
	// that opens says nothing about a list that failed.
	setBy string
}

// Source watches the objects the model needs, with informers whose
// objects are trimmed to what the page shows.
type Source struct {
	resources []*watched
	changed   chan struct{}
	onStatus  func()
}

// Resources lists what a fleet view reads: list and watch on each.
var Resources = []string{"nodes", "pods", "resourceslices.resource.k8s.io", "resourceclaims.resource.k8s.io", "devicetaintrules.resource.k8s.io"}

// NewSource prepares informers for client; Run starts them. onStatus is
// called when a resource's state changes.
func NewSource(client kubernetes.Interface, onStatus func()) *Source {
	s := &Source{changed: make(chan struct{}, 1), onStatus: onStatus}
	core, res := client.CoreV1(), client.ResourceV1()
	s.add(client, Resources[0], &corev1.Node{}, trimNode, listWatchOf(core.Nodes()))
	s.add(client, Resources[1], &corev1.Pod{}, trimPod, listWatchOf(core.Pods("")))
	s.add(client, Resources[2], &resourceapi.ResourceSlice{}, trimSlice, listWatchOf(res.ResourceSlices()))
	s.add(client, Resources[3], &resourceapi.ResourceClaim{}, trimClaim, listWatchOf(res.ResourceClaims("")))
	s.add(client, Resources[4], &resourceapi.DeviceTaintRule{}, trimMeta, listWatchOf(res.DeviceTaintRules()))
	return s
}

// listWatcher is what a typed client of one resource offers: List returns
// that resource's list type.
type listWatcher[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// listWatch is the list and watch calls of one resource.
type listWatch struct {
	list  cache.ListWithContextFunc
	watch cache.WatchFuncWithContext
}

func listWatchOf[L runtime.Object](c listWatcher[L]) listWatch {
	return listWatch{
		list: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			l, err := c.List(ctx, o)
			if err != nil {
				// Not a typed nil inside a non-nil runtime.Object.
				return nil, err
			}
			return l, nil
		},
		watch: c.Watch,
	}
}

func (s *Source) add(client kubernetes.Interface, name string, example runtime.Object, transform cache.TransformFunc, calls listWatch) {
	r := &watched{name: name, status: ResourceStatus{Resource: name, State: StateWaiting}}
	// The list and watch calls report how they went, with the verb: the
	// informer itself only retries.
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			obj, err := calls.list(ctx, o)
			s.report(ctx, r, "list", err)
			return obj, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w, err := calls.watch(ctx, o)
			s.report(ctx, r, "watch", err)
			return w, err
		},
	}
	// The client says whether it can stream the initial list in a watch
	// (the fake clientset cannot).
	r.informer = cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), example, cache.SharedIndexInformerOptions{ObjectDescription: name})
	_ = r.informer.SetTransform(transform)
	_, _ = r.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.notify() },
		UpdateFunc: func(any, any) { s.notify() },
		DeleteFunc: func(any) { s.notify() },
	})
	s.resources = append(s.resources, r)
}

// verbInMessage finds the verb in an authorization error: `User "u"
// cannot list resource "pods"`.
var verbInMessage = regexp.MustCompile(`cannot (\w+) resource`)

// report records how a call for r went.
func (s *Source) report(ctx context.Context, r *watched, verb string, err error) {
	st := ResourceStatus{Resource: r.name, State: StateSynced}
	switch {
	case err == nil:
	case errors.Is(err, context.Canceled) || ctx.Err() != nil:
		return
	case apierrors.IsForbidden(err):
		st.State, st.Verb, st.Message = StateForbidden, verb, err.Error()
		if m := verbInMessage.FindStringSubmatch(err.Error()); m != nil {
			st.Verb = m[1]
		}
	case apierrors.IsNotFound(err):
		st.State, st.Message = StateNotServed, err.Error()
	default:
		st.State, st.Verb, st.Message = StateError, verb, err.Error()
	}
	r.mu.Lock()
	old := r.status
	if err == nil && verb == "watch" && r.setBy == "list" {
		r.mu.Unlock()
		return
	}
	r.status, r.setBy = st, verb
	r.mu.Unlock()
	if old != st {
		klog.FromContext(ctx).V(2).Info("Fleet view resource state", "resource", r.name, "state", st.State, "verb", st.Verb, "err", err)
		s.onStatus()
		s.notify()
	}
}

func (s *Source) notify() {
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// Changed delivers a value (coalesced) after objects change.
func (s *Source) Changed() <-chan struct{} { return s.changed }

// Run runs the informers until ctx is done.
func (s *Source) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, r := range s.resources {
		wg.Go(func() { r.informer.RunWithContext(ctx) })
	}
	wg.Wait()
}

// Statuses returns each resource's state; a resource whose informer has
// synced and saw no error since is synced.
func (s *Source) Statuses() []ResourceStatus {
	out := make([]ResourceStatus, 0, len(s.resources))
	for _, r := range s.resources {
		r.mu.Lock()
		st := r.status
		r.mu.Unlock()
		if st.State == StateSynced && !r.informer.HasSynced() {
			st.State = StateWaiting
		}
		out = append(out, st)
	}
	return out
}

// Objects returns what the informers hold now.
func (s *Source) Objects(driver string) Objects {
	out := Objects{Driver: driver}
	out.Nodes = items[*corev1.Node](s.resources[0])
	out.Pods = items[*corev1.Pod](s.resources[1])
	out.Slices = items[*resourceapi.ResourceSlice](s.resources[2])
	out.Claims = items[*resourceapi.ResourceClaim](s.resources[3])
	out.TaintRules = items[*resourceapi.DeviceTaintRule](s.resources[4])
	return out
}

func items[T any](r *watched) []T {
	list := r.informer.GetStore().List()
	out := make([]T, 0, len(list))
	for _, o := range list {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}

// Transforms: the informers keep only what the model reads, so that a
// fleet of 1,000 nodes and their pods costs little memory. Each trims the
// fresh object it is given in place.

func trimMeta(obj any) (any, error) {
	if a, ok := obj.(metav1.Object); ok {
		a.SetManagedFields(nil)
		a.SetAnnotations(nil)
		a.SetLabels(nil)
		a.SetOwnerReferences(nil)
	}
	return obj, nil
}

func trimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return trimMeta(obj)
	}
	_, _ = trimMeta(n)
	var ready []corev1.NodeCondition
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			ready = append(ready, corev1.NodeCondition{Type: c.Type, Status: c.Status})
		}
	}
	n.Spec = corev1.NodeSpec{Taints: n.Spec.Taints, Unschedulable: n.Spec.Unschedulable}
	n.Status = corev1.NodeStatus{Conditions: ready}
	return n, nil
}

func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return trimMeta(obj)
	}
	_, _ = trimMeta(p)
	p.Spec = corev1.PodSpec{NodeName: p.Spec.NodeName, ResourceClaims: p.Spec.ResourceClaims}
	p.Status = corev1.PodStatus{Phase: p.Status.Phase, ResourceClaimStatuses: p.Status.ResourceClaimStatuses}
	return p, nil
}

// keptAttributes are the device attributes the model reads.
var keptAttributes = []resourceapi.QualifiedName{"type", "uuid", "parentUUID", "productName", "profile", "sharingMode", "resource.kubernetes.io/pciBusID"}

func trimSlice(obj any) (any, error) {
	s, ok := obj.(*resourceapi.ResourceSlice)
	if !ok {
		return trimMeta(obj)
	}
	_, _ = trimMeta(s)
	s.Spec.SharedCounters = nil
	for i := range s.Spec.Devices {
		d := &s.Spec.Devices[i]
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
		for _, k := range keptAttributes {
			if a, ok := d.Attributes[k]; ok {
				attrs[k] = a
			}
		}
		var capacity map[resourceapi.QualifiedName]resourceapi.DeviceCapacity
		if c, ok := d.Capacity["memory"]; ok {
			capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: c.Value}}
		}
		*d = resourceapi.Device{Name: d.Name, Attributes: attrs, Capacity: capacity, Taints: d.Taints}
	}
	return s, nil
}

func trimClaim(obj any) (any, error) {
	c, ok := obj.(*resourceapi.ResourceClaim)
	if !ok {
		return trimMeta(obj)
	}
	_, _ = trimMeta(c)
	c.Spec = resourceapi.ResourceClaimSpec{}
	c.Status.Devices = nil
	if a := c.Status.Allocation; a != nil {
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: a.Devices.Results}}
	}
	return c, nil
}

// Probe reports whether the API server answers: the page's banner says
// when it does not within seconds, while client-go retries a broken watch
// for a while before the informers notice.
type Probe func(ctx context.Context) error

// VersionProbe asks the API server for /version.
func VersionProbe(client kubernetes.Interface) Probe {
	return func(ctx context.Context) error {
		rc := client.Discovery().RESTClient()
		if rc == nil {
			_, err := client.Discovery().ServerVersion()
			return err
		}
		if err := rc.Get().AbsPath("/version").Do(ctx).Error(); err != nil {
			return fmt.Errorf("GET /version: %w", err)
		}
		return nil
	}
}

// probeTimeout bounds one probe: an API server that takes longer to
// answer /version counts as gone.
const probeTimeout = 1500 * time.Millisecond
