package node

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/computedomain"
)

// reportRetry is how soon a failed report is tried again.
const reportRetry = 2 * time.Second

// ReporterConfig configures a [Reporter].
type ReporterConfig struct {
	Dynamic dynamic.Interface
	// Indices hands out the node's IMEX index per clique.
	Indices *IndexRegistry
	// Namespace is the clique namespace (the driver's).
	Namespace string
	// NodeName and NodeIP are this node's.
	NodeName, NodeIP string
	// Peers, if set, is called with the clique's peers (IMEX index to IP,
	// from every domain's clique object of the node's clique) each time
	// they change.
	Peers func(ctx context.Context, peers map[int]string)
}

// Reporter writes this node's entry, and only it, in the
// ComputeDomainClique of each domain the node serves: its IMEX index, IP
// and daemon readiness, by server-side apply under the node's own field
// manager, and only when the entry changed. The controller derives the
// domain's status from these objects. It also watches the objects of the
// node's clique for the peers' addresses.
type Reporter struct {
	cfg  ReporterConfig
	wake chan struct{}

	mu       sync.Mutex
	domains  map[string]string // domain UID -> clique ID
	indices  map[string]int    // clique ID -> index
	ready    bool
	reported map[string]v1beta1.ComputeDomainDaemonInfo // clique object -> entry applied
	peers    map[int]string
}

// NewReporter returns a reporter; [Reporter.Run] starts its watch.
func NewReporter(cfg ReporterConfig) *Reporter {
	return &Reporter{
		cfg:      cfg,
		wake:     make(chan struct{}, 1),
		domains:  map[string]string{},
		indices:  map[string]int{},
		reported: map[string]v1beta1.ComputeDomainDaemonInfo{},
	}
}

// Join makes the node a member of the domain in cliqueID: it takes the
// node's index in the clique (once) and reports its entry. A domain whose
// report failed stays joined: Run tries again.
func (r *Reporter) Join(ctx context.Context, domainUID, cliqueID string) error {
	r.mu.Lock()
	r.domains[domainUID] = cliqueID
	r.mu.Unlock()
	return r.report(ctx, domainUID)
}

// index returns the node's index in cliqueID, taking it the first time.
func (r *Reporter) index(ctx context.Context, cliqueID string) (int, error) {
	r.mu.Lock()
	index, ok := r.indices[cliqueID]
	r.mu.Unlock()
	if ok {
		return index, nil
	}
	index, err := r.cfg.Indices.Take(ctx, cliqueID, r.cfg.NodeName)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	r.indices[cliqueID] = index
	r.mu.Unlock()
	r.poke() // the clique's peers are now the node's
	return index, nil
}

// Leave removes the node's entry from the domain's clique object with a
// JSON patch that tests the entry is the node's: unlike an apply, a patch
// never creates the object again once the controller deleted it.
func (r *Reporter) Leave(ctx context.Context, domainUID string) error {
	r.mu.Lock()
	cliqueID, ok := r.domains[domainUID]
	delete(r.domains, domainUID)
	r.mu.Unlock()
	if !ok {
		return nil
	}
	name := computedomain.CliqueName(domainUID, cliqueID)
	client := r.cfg.Dynamic.Resource(computedomain.CliqueGVR).Namespace(r.cfg.Namespace)
	for attempt := 0; ; attempt++ {
		u, err := client.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		if err != nil {
			return fmt.Errorf("leave ComputeDomainClique %s/%s: %w", r.cfg.Namespace, name, err)
		}
		daemons, _, _ := unstructured.NestedSlice(u.Object, "daemons")
		at := slices.IndexFunc(daemons, func(d any) bool {
			m, _ := d.(map[string]any)
			return m["nodeName"] == r.cfg.NodeName
		})
		if at < 0 {
			break
		}
		patch, _ := json.Marshal([]map[string]any{
			{"op": "test", "path": fmt.Sprintf("/daemons/%d/nodeName", at), "value": r.cfg.NodeName},
			{"op": "remove", "path": fmt.Sprintf("/daemons/%d", at)},
		})
		_, err = client.Patch(ctx, name, types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: computedomain.NodeFieldManager(r.cfg.NodeName)})
		if err == nil || apierrors.IsNotFound(err) {
			break
		}
		// The entry moved (another node left first): read again.
		if attempt >= 10 || !(apierrors.IsInvalid(err) || apierrors.IsConflict(err) || strings.Contains(err.Error(), "test")) {
			return fmt.Errorf("leave ComputeDomainClique %s/%s: %w", r.cfg.Namespace, name, err)
		}
	}
	r.mu.Lock()
	delete(r.reported, name)
	r.mu.Unlock()
	return nil
}

// SetReady records the node's IMEX daemon readiness; Run reports it.
func (r *Reporter) SetReady(ready bool) {
	r.mu.Lock()
	r.ready = ready
	r.mu.Unlock()
	r.poke()
}

// Domains returns the UIDs of the domains the node reports in.
func (r *Reporter) Domains() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.domains))
}

func (r *Reporter) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// entry is what the node's entry in the domain's clique should be.
func (r *Reporter) entry(domainUID string) (name string, e v1beta1.ComputeDomainDaemonInfo, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cliqueID, ok := r.domains[domainUID]
	if !ok {
		return "", e, false
	}
	status := v1beta1.ComputeDomainStatusNotReady
	if r.ready {
		status = v1beta1.ComputeDomainStatusReady
	}
	e = v1beta1.ComputeDomainDaemonInfo{NodeName: r.cfg.NodeName, IPAddress: r.cfg.NodeIP, CliqueID: cliqueID, Index: r.indices[cliqueID], Status: status}
	return computedomain.CliqueName(domainUID, cliqueID), e, true
}

// report applies the node's entry of one domain if it changed.
func (r *Reporter) report(ctx context.Context, domainUID string) error {
	r.mu.Lock()
	cliqueID, ok := r.domains[domainUID]
	r.mu.Unlock()
	if !ok {
		return nil
	}
	if _, err := r.index(ctx, cliqueID); err != nil {
		return err
	}
	name, e, ok := r.entry(domainUID)
	if !ok {
		return nil
	}
	r.mu.Lock()
	last, done := r.reported[name]
	r.mu.Unlock()
	if done && last == e {
		return nil
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1beta1.GroupName + "/" + v1beta1.Version,
		"kind":       v1beta1.ComputeDomainCliqueKind,
		"metadata": map[string]any{"name": name, "namespace": r.cfg.Namespace,
			"labels": map[string]any{computedomain.CliqueLabel: computedomain.CliqueLabelValue(e.CliqueID)}},
	}}
	entry, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&e)
	if err != nil {
		return err
	}
	u.Object["daemons"] = []any{entry}
	_, err = r.cfg.Dynamic.Resource(computedomain.CliqueGVR).Namespace(r.cfg.Namespace).Apply(ctx, name, u, metav1.ApplyOptions{FieldManager: computedomain.NodeFieldManager(r.cfg.NodeName), Force: true})
	if err != nil {
		return fmt.Errorf("report node %s in ComputeDomainClique %s/%s: %w", r.cfg.NodeName, r.cfg.Namespace, name, err)
	}
	klog.FromContext(ctx).V(2).Info("Reported the node's IMEX daemon", "clique", name, "index", e.Index, "status", e.Status)
	r.mu.Lock()
	r.reported[name] = e
	r.mu.Unlock()
	return nil
}

// Run reports changed entries until ctx ends (readiness changes, and
// reports that failed), and watches the objects of the node's clique (by
// CliqueLabel: a node never watches other cliques' objects) for its peers.
func (r *Reporter) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	w := &cliqueWatch{}
	defer w.stop()
	retry := time.NewTimer(reportRetry)
	defer retry.Stop()
	for {
		failed := false
		for _, uid := range r.Domains() {
			if err := r.report(ctx, uid); err != nil {
				logger.Error(err, "Reporting the node's IMEX daemon failed; retrying", "domain", uid)
				failed = true
			}
		}
		if clique := r.clique(); clique != "" && clique != w.clique {
			w.start(ctx, r, clique)
		}
		if w.synced() {
			r.updatePeers(ctx, w.clique, w.inf.GetStore())
		}
		if failed || (w.inf != nil && !w.synced()) {
			retry.Reset(reportRetry)
		}
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		case <-retry.C:
		}
	}
}

// clique returns the clique the node has an index in (a node is in one);
// "" before its first join.
func (r *Reporter) clique() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := slices.Sorted(maps.Keys(r.indices))
	if len(ids) == 0 {
		return ""
	}
	return ids[len(ids)-1]
}

// cliqueWatch is the informer on one clique's objects.
type cliqueWatch struct {
	clique string
	inf    cache.SharedIndexInformer
	cancel context.CancelFunc
}

func (w *cliqueWatch) start(ctx context.Context, r *Reporter, clique string) {
	w.stop()
	ctx, w.cancel = context.WithCancel(ctx)
	selector := computedomain.CliqueLabel + "=" + computedomain.CliqueLabelValue(clique)
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(r.cfg.Dynamic, 0, r.cfg.Namespace, func(o *metav1.ListOptions) {
		o.LabelSelector = selector
	})
	w.inf = f.ForResource(computedomain.CliqueGVR).Informer()
	_, _ = w.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { r.poke() },
		UpdateFunc: func(any, any) { r.poke() },
		DeleteFunc: func(any) { r.poke() },
	})
	w.clique = clique
	go w.inf.Run(ctx.Done())
}

func (w *cliqueWatch) synced() bool { return w.inf != nil && w.inf.HasSynced() }

func (w *cliqueWatch) stop() {
	if w.cancel != nil {
		w.cancel()
	}
}

// Peers returns the peers of the node's cliques as last seen.
func (r *Reporter) Peers() map[int]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.peers)
}

// updatePeers computes the peers of the node's clique from the watched
// objects and hands them to cfg.Peers when they changed.
func (r *Reporter) updatePeers(ctx context.Context, clique string, store cache.Store) {
	peers := map[int]string{}
	for _, obj := range store.List() {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		cl := &v1beta1.ComputeDomainClique{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, cl); err != nil {
			continue
		}
		for _, d := range cl.Daemons {
			if d != nil && d.IPAddress != "" && d.CliqueID == clique {
				peers[d.Index] = d.IPAddress
			}
		}
	}
	r.mu.Lock()
	same := r.peers != nil && maps.Equal(peers, r.peers)
	r.peers = peers
	r.mu.Unlock()
	if !same && r.cfg.Peers != nil {
		r.cfg.Peers(ctx, peers)
	}
}
