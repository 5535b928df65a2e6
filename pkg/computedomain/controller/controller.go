package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/computedomain"
)

// Names the controller uses, NVIDIA's where NVIDIA's driver has them.
const (
	// Finalizer holds a domain until what the controller created for it
	// is gone.
	Finalizer = "resource.nvidia.com/computeDomain"
	// DomainLabel marks the objects the controller created for a domain,
	// with the domain's UID.
	DomainLabel = "resource.nvidia.com/computeDomain"
	// ChannelDeviceClass is the class of the channel claims' devices.
	ChannelDeviceClass = "compute-domain-default-channel.nvidia.com"
	// ChannelRequest is the request name in the claim template.
	ChannelRequest = "channel"
	// FieldManager is the controller's field manager.
	FieldManager = "gpudra-compute-domain-controller"
)

// Condition types and reasons the controller sets.
const (
	ConditionSpecValid         = "SpecValid"
	ConditionChannelAssigned   = "ChannelAssigned"
	ConditionTemplateCreated   = "ResourceClaimTemplateCreated"
	ReasonInvalidSpec          = "InvalidSpec"
	ReasonValid                = "Valid"
	ReasonAssigned             = "Assigned"
	ReasonChannelsExhausted    = "ChannelsExhausted"
	ReasonCreated              = "Created"
	ReasonTemplateNameConflict = "TemplateNameConflict"
	ReasonCreateFailed         = "CreateFailed"
)

// Config is what the controller needs.
type Config struct {
	KubeClient    kubernetes.Interface
	DynamicClient dynamic.Interface
	// MaxChannels is the nodes' IMEX channel count; channels are handed
	// out from 0..MaxChannels-1.
	MaxChannels int
	// Resync is how often every domain is reconciled again; zero means
	// five minutes.
	Resync time.Duration
	// CliqueNamespace is the driver's namespace, where the nodes report
	// their IMEX daemons in ComputeDomainCliques ("<domain UID>.<clique
	// ID>"); the domains' status.nodes are derived from them. Empty: no
	// status.nodes.
	CliqueNamespace string
	// ChannelDriver, if set, is the channel driver's name: its
	// ResourceSlices tell the size of each NVLink clique, and a domain
	// whose spec.numNodes exceeds the largest gets FitsInClique=False.
	ChannelDriver string
}

// Controller runs the ComputeDomains of the cluster: per domain, the
// ResourceClaimTemplate its pods use, its IMEX channel, the finalizer
// that cleans up, and its status. One worker reconciles, so the channel
// assigner has one owner; run it leader-elected, one per cluster.
type Controller struct {
	cfg      Config
	informer cache.SharedIndexInformer
	// cliques is nil without Config.CliqueNamespace.
	cliques cache.SharedIndexInformer
	// sizes is nil without Config.ChannelDriver.
	sizes *cliqueSizes
	queue workqueue.TypedRateLimitingInterface[string]

	mu       sync.Mutex
	channels *ChannelAssigner
	// uids remembers each key's UID, to free the channel of a domain that
	// vanished without the controller seeing its deletion; keys is the
	// reverse, to find the domain of a clique.
	uids map[string]types.UID
	keys map[types.UID]string
}

// New returns a controller; Run starts it.
func New(cfg Config) *Controller {
	if cfg.Resync <= 0 {
		cfg.Resync = 5 * time.Minute
	}
	factory := dynamicinformer.NewDynamicSharedInformerFactory(cfg.DynamicClient, cfg.Resync)
	c := &Controller{
		cfg:      cfg,
		informer: factory.ForResource(computedomain.GVR).Informer(),
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		uids:     map[string]types.UID{},
		keys:     map[types.UID]string{},
	}
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			c.queue.Add(key)
		}
	}
	_, _ = c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	})
	if cfg.ChannelDriver != "" && cfg.KubeClient != nil {
		c.sizes = newCliqueSizes(cfg.KubeClient, cfg.ChannelDriver)
		// A clique that grows or shrinks changes whether domains fit.
		_, _ = c.sizes.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { c.enqueueAll() },
			UpdateFunc: func(any, any) { c.enqueueAll() },
			DeleteFunc: func(any) { c.enqueueAll() },
		})
	}
	if cfg.CliqueNamespace != "" {
		cf := dynamicinformer.NewFilteredDynamicSharedInformerFactory(cfg.DynamicClient, cfg.Resync, cfg.CliqueNamespace, nil)
		c.cliques = cf.ForResource(computedomain.CliqueGVR).Informer()
		enqueueDomain := func(obj any) {
			key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
			if err != nil {
				return
			}
			_, name, _ := cache.SplitMetaNamespaceKey(key)
			uid, _, _ := strings.Cut(name, ".")
			c.mu.Lock()
			domainKey, ok := c.keys[types.UID(uid)]
			c.mu.Unlock()
			if ok {
				c.queue.Add(domainKey)
			}
		}
		_, _ = c.cliques.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    enqueueDomain,
			UpdateFunc: func(_, obj any) { enqueueDomain(obj) },
			DeleteFunc: enqueueDomain,
		})
	}
	return c
}

// Run reconciles until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithName("compute-domain-controller")
	ctx = klog.NewContext(ctx, logger)
	defer c.queue.ShutDown()
	go c.informer.Run(ctx.Done())
	synced := []cache.InformerSynced{c.informer.HasSynced}
	if c.cliques != nil {
		go c.cliques.Run(ctx.Done())
		synced = append(synced, c.cliques.HasSynced)
	}
	if c.sizes != nil {
		go c.sizes.informer.Run(ctx.Done())
		synced = append(synced, c.sizes.informer.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("ComputeDomain informer did not sync: %w", ctx.Err())
	}
	if err := c.seed(ctx); err != nil {
		return err
	}
	logger.Info("ComputeDomain controller started", "maxChannels", c.cfg.MaxChannels)
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	for c.processNext(ctx) {
	}
	return nil
}

// seed learns the channels the domains hold, from a fresh list (not the
// cache), so that a new leader never hands out a channel its predecessor
// gave away.
func (c *Controller) seed(ctx context.Context) error {
	list, err := c.cfg.DynamicClient.Resource(computedomain.GVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list ComputeDomains: %w", err)
	}
	var domains []*v1beta1.ComputeDomain
	for i := range list.Items {
		cd, err := computedomain.FromUnstructured(&list.Items[i])
		if err != nil {
			return err
		}
		domains = append(domains, cd)
	}
	a, conflicts := SeedChannels(c.cfg.MaxChannels, domains)
	for _, cd := range conflicts {
		klog.FromContext(ctx).Error(nil, "Two ComputeDomains hold one IMEX channel; the newer gets another", "domain", klog.KObj(cd), "channel", *cd.Status.Channel)
	}
	c.mu.Lock()
	c.channels = a
	c.mu.Unlock()
	return nil
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	err := c.Reconcile(ctx, key)
	var wait *WaitError
	if errors.As(err, &wait) {
		klog.FromContext(ctx).V(2).Info("Waiting", "key", key, "reason", wait.Reason, "retryIn", wait.After)
		c.queue.Forget(key)
		c.queue.AddAfter(key, wait.After)
		return true
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Reconciling ComputeDomain; retrying", "key", key)
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

// Reconcile brings one domain (namespace/name) to what its spec asks.
func (c *Controller) Reconcile(ctx context.Context, key string) error {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return err
	}
	obj, err := c.cfg.DynamicClient.Resource(computedomain.GVR).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		c.mu.Lock()
		if uid, ok := c.uids[key]; ok {
			c.channels.Release(uid)
			delete(c.uids, key)
			delete(c.keys, uid)
		}
		c.mu.Unlock()
		return nil
	}
	if err != nil {
		return fmt.Errorf("get ComputeDomain %s: %w", key, err)
	}
	cd, err := computedomain.FromUnstructured(obj)
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.uids[key] = cd.UID
	c.keys[cd.UID] = key
	c.mu.Unlock()
	if cd.DeletionTimestamp != nil {
		return c.finalize(ctx, cd)
	}
	if err := c.addFinalizer(ctx, cd); err != nil {
		return err
	}
	var conds []metav1.Condition
	if errs := v1beta1.ValidateComputeDomainSpec(&cd.Spec); len(errs) > 0 {
		// Nothing is created for a domain whose spec is wrong; the spec
		// is immutable, so the user deletes it and creates another.
		conds = append(conds, condition(cd, ConditionSpecValid, metav1.ConditionFalse, ReasonInvalidSpec, errs.ToAggregate().Error()))
		return c.writeStatus(ctx, cd, nil, conds)
	}
	conds = append(conds, condition(cd, ConditionSpecValid, metav1.ConditionTrue, ReasonValid, "the spec is valid"))

	c.mu.Lock()
	channel, chErr := c.channels.Assign(cd.UID)
	c.mu.Unlock()
	var ch *int32
	if chErr != nil {
		conds = append(conds, condition(cd, ConditionChannelAssigned, metav1.ConditionFalse, ReasonChannelsExhausted, chErr.Error()))
	} else {
		ch = &channel
		conds = append(conds, condition(cd, ConditionChannelAssigned, metav1.ConditionTrue, ReasonAssigned, fmt.Sprintf("IMEX channel %d on every node of the domain", channel)))
	}
	if ch == nil {
		return c.writeStatus(ctx, cd, nil, conds)
	}
	// The channel is recorded before the template exists: no claim of the
	// domain can reach a node before the domain has its channel. Once
	// recorded, only the final status is written, and only if it changed.
	if !equalChannel(cd.Status.Channel, ch) {
		if err := c.writeStatus(ctx, cd, ch, conds); err != nil {
			return err
		}
	}
	tmplCond, err := c.ensureTemplate(ctx, cd)
	if tmplCond.Type == "" {
		return err
	}
	conds = append(conds, tmplCond)
	if fit, ok := c.sizes.fitCondition(cd); ok {
		conds = append(conds, fit)
	}
	if werr := c.writeStatus(ctx, cd, ch, conds); werr != nil {
		return errors.Join(err, werr)
	}
	// A refused creation is on the domain's status, and retried.
	return err
}

func condition(cd *v1beta1.ComputeDomain, typ string, status metav1.ConditionStatus, reason, msg string) metav1.Condition {
	c := metav1.Condition{Type: typ, Status: status, Reason: reason, Message: msg, ObservedGeneration: cd.Generation, LastTransitionTime: metav1.Now()}
	// Keep the transition time of a condition that did not change.
	if old := meta.FindStatusCondition(cd.Status.Conditions, typ); old != nil && old.Status == status {
		c.LastTransitionTime = old.LastTransitionTime
	}
	return c
}

// writeStatus merge-patches the fields the controller owns: the channel,
// the conditions and the overall status. The node entries are not
// touched, and no resourceVersion is read back and written: a patch of
// its own fields cannot race another writer's.
func (c *Controller) writeStatus(ctx context.Context, cd *v1beta1.ComputeDomain, ch *int32, conds []metav1.Condition) error {
	nodes := c.nodesOf(cd)
	status := v1beta1.ComputeDomainStatusNotReady
	ready := ch != nil && !slices.ContainsFunc(conds, func(c metav1.Condition) bool { return c.Status != metav1.ConditionTrue })
	if ready && len(conds) >= 3 && (cd.Spec.NumNodes == 0 || readyNodes(nodes) >= cd.Spec.NumNodes) {
		status = v1beta1.ComputeDomainStatusReady
	}
	if cd.Status.Status == status && equalChannel(cd.Status.Channel, ch) && sameConditions(cd.Status.Conditions, conds) && sameNodes(cd.Status.Nodes, nodes) {
		return nil
	}
	patch := map[string]any{"status": map[string]any{"status": status, "channel": ch, "conditions": conds, "nodes": nodes}}
	data, err := json.Marshal(patch)
	if err != nil {
		return err
	}
	obj, err := c.cfg.DynamicClient.Resource(computedomain.GVR).Namespace(cd.Namespace).Patch(ctx, cd.Name, types.MergePatchType, data, metav1.PatchOptions{FieldManager: FieldManager}, "status")
	if err != nil {
		return fmt.Errorf("write status of ComputeDomain %s/%s: %w", cd.Namespace, cd.Name, err)
	}
	updated, err := computedomain.FromUnstructured(obj)
	if err != nil {
		return err
	}
	*cd = *updated
	return nil
}

// nodesOf derives the domain's nodes from the ComputeDomainCliques the
// nodes write, one entry per node, ordered by clique, index and name. A
// node in two cliques of the domain (it moved) is listed once, from the
// clique that sorts first.
func (c *Controller) nodesOf(cd *v1beta1.ComputeDomain) []*v1beta1.ComputeDomainNode {
	if c.cliques == nil {
		return cd.Status.Nodes
	}
	var nodes []*v1beta1.ComputeDomainNode
	seen := map[string]bool{}
	prefix := string(cd.UID) + "."
	objs := c.cliques.GetStore().List()
	var cliques []*v1beta1.ComputeDomainClique
	for _, obj := range objs {
		u, ok := obj.(*unstructured.Unstructured)
		if !ok || !strings.HasPrefix(u.GetName(), prefix) {
			continue
		}
		cl := &v1beta1.ComputeDomainClique{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), cl); err != nil {
			continue
		}
		cliques = append(cliques, cl)
	}
	slices.SortFunc(cliques, func(a, b *v1beta1.ComputeDomainClique) int { return strings.Compare(a.Name, b.Name) })
	for _, cl := range cliques {
		for _, d := range cl.Daemons {
			if d == nil || seen[d.NodeName] {
				continue
			}
			seen[d.NodeName] = true
			nodes = append(nodes, &v1beta1.ComputeDomainNode{Name: d.NodeName, IPAddress: d.IPAddress, CliqueID: d.CliqueID, Index: d.Index, Status: d.Status})
		}
	}
	slices.SortFunc(nodes, func(a, b *v1beta1.ComputeDomainNode) int {
		if c := strings.Compare(a.CliqueID, b.CliqueID); c != 0 {
			return c
		}
		if a.Index != b.Index {
			return a.Index - b.Index
		}
		return strings.Compare(a.Name, b.Name)
	})
	return nodes
}

func sameNodes(a, b []*v1beta1.ComputeDomainNode) bool {
	return slices.EqualFunc(a, b, func(x, y *v1beta1.ComputeDomainNode) bool {
		return x != nil && y != nil && *x == *y
	})
}

func readyNodes(nodes []*v1beta1.ComputeDomainNode) int {
	n := 0
	for _, node := range nodes {
		if node != nil && node.Status == v1beta1.ComputeDomainStatusReady {
			n++
		}
	}
	return n
}

func equalChannel(a, b *int32) bool {
	return a == nil && b == nil || a != nil && b != nil && *a == *b
}

func sameConditions(a, b []metav1.Condition) bool {
	return slices.EqualFunc(a, b, func(x, y metav1.Condition) bool {
		return x.Type == y.Type && x.Status == y.Status && x.Reason == y.Reason && x.Message == y.Message && x.ObservedGeneration == y.ObservedGeneration
	})
}

// ensureTemplate creates the domain's ResourceClaimTemplate. A template of
// that name that the domain did not create is left alone, and the
// condition names the field. A creation the API server refuses (no
// permission, a quota, an admission webhook) is both a False condition
// with the server's message, for the user, and an error, so that it is
// retried; any other error comes without a condition.
func (c *Controller) ensureTemplate(ctx context.Context, cd *v1beta1.ComputeDomain) (metav1.Condition, error) {
	name := cd.Spec.Channel.ResourceClaimTemplate.Name
	want, err := channelTemplate(cd)
	if err != nil {
		return metav1.Condition{}, err
	}
	templates := c.cfg.KubeClient.ResourceV1().ResourceClaimTemplates(cd.Namespace)
	_, err = templates.Create(ctx, want, metav1.CreateOptions{FieldManager: FieldManager})
	switch {
	case err == nil:
		klog.FromContext(ctx).Info("Created the ResourceClaimTemplate of a ComputeDomain", "domain", klog.KObj(cd), "template", name)
	case apierrors.IsAlreadyExists(err):
		got, err := templates.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return metav1.Condition{}, fmt.Errorf("get ResourceClaimTemplate %s/%s: %w", cd.Namespace, name, err)
		}
		if got.Labels[DomainLabel] != string(cd.UID) {
			return condition(cd, ConditionTemplateCreated, metav1.ConditionFalse, ReasonTemplateNameConflict,
				fmt.Sprintf("spec.channel.resourceClaimTemplate.name: ResourceClaimTemplate %s/%s exists and belongs to no ComputeDomain of this UID; choose another name", cd.Namespace, name)), nil
		}
	default:
		err = fmt.Errorf("create ResourceClaimTemplate %s/%s: %w", cd.Namespace, name, err)
		return condition(cd, ConditionTemplateCreated, metav1.ConditionFalse, ReasonCreateFailed, err.Error()), err
	}
	return condition(cd, ConditionTemplateCreated, metav1.ConditionTrue, ReasonCreated, fmt.Sprintf("ResourceClaimTemplate %s", name)), nil
}

// channelTemplate is the ResourceClaimTemplate of a domain's channel
// claims: one channel device of the default-channel class, configured
// with the domain's UID and allocation mode.
func channelTemplate(cd *v1beta1.ComputeDomain) (*resourceapi.ResourceClaimTemplate, error) {
	cfg := v1beta1.ComputeDomainChannelConfig{
		TypeMeta:       metav1.TypeMeta{APIVersion: v1beta1.SchemeGroupVersion.String(), Kind: v1beta1.ComputeDomainChannelConfigKind},
		DomainID:       string(cd.UID),
		AllocationMode: cd.Spec.Channel.AllocationMode,
	}
	if cfg.AllocationMode == "" {
		cfg.AllocationMode = v1beta1.ChannelAllocationModeSingle
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: cd.Namespace,
			Name:      cd.Spec.Channel.ResourceClaimTemplate.Name,
			Labels:    map[string]string{DomainLabel: string(cd.UID)},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: v1beta1.SchemeGroupVersion.String(), Kind: v1beta1.ComputeDomainKind,
				Name: cd.Name, UID: cd.UID,
			}},
		},
		Spec: resourceapi.ResourceClaimTemplateSpec{
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
				Requests: []resourceapi.DeviceRequest{{
					Name:    ChannelRequest,
					Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: ChannelDeviceClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
				}},
				Config: []resourceapi.DeviceClaimConfiguration{{
					Requests: []string{ChannelRequest},
					DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
						Driver: computedomain.DriverName, Parameters: runtime.RawExtension{Raw: raw},
					}},
				}},
			}},
		},
	}, nil
}

// addFinalizer adds the finalizer with a JSON patch that tests the list
// it extends, so another writer's finalizers are never lost.
func (c *Controller) addFinalizer(ctx context.Context, cd *v1beta1.ComputeDomain) error {
	if slices.Contains(cd.Finalizers, Finalizer) {
		return nil
	}
	var ops []map[string]any
	if len(cd.Finalizers) == 0 {
		ops = []map[string]any{{"op": "test", "path": "/metadata/resourceVersion", "value": cd.ResourceVersion}, {"op": "add", "path": "/metadata/finalizers", "value": []string{Finalizer}}}
	} else {
		ops = []map[string]any{{"op": "add", "path": "/metadata/finalizers/-", "value": Finalizer}}
	}
	return c.patchMeta(ctx, cd, ops)
}

// WaitError is returned by Reconcile when the domain waits for something
// that no watched object announces: it is looked at again After.
type WaitError struct {
	Reason string
	After  time.Duration
}

func (e *WaitError) Error() string { return fmt.Sprintf("%s; again in %v", e.Reason, e.After) }

// claimWait is how often a deleted domain looks again for its claims.
const claimWait = 2 * time.Second

// finalize deletes what the controller created for the domain, waits
// until no ResourceClaim of the domain is left, frees its channel and
// removes the finalizer. The wait closes an isolation gap: a channel freed
// while pods of the deleted domain still hold it on nodes could go to a new
// domain, whose pods on other nodes would share it with them across the
// fabric.
func (c *Controller) finalize(ctx context.Context, cd *v1beta1.ComputeDomain) error {
	i := slices.Index(cd.Finalizers, Finalizer)
	if i < 0 {
		return nil
	}
	templates := c.cfg.KubeClient.ResourceV1().ResourceClaimTemplates(cd.Namespace)
	list, err := templates.List(ctx, metav1.ListOptions{LabelSelector: DomainLabel + "=" + string(cd.UID)})
	if err != nil {
		return fmt.Errorf("list ResourceClaimTemplates of ComputeDomain %s/%s: %w", cd.Namespace, cd.Name, err)
	}
	for _, t := range list.Items {
		err := templates.Delete(ctx, t.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &t.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete ResourceClaimTemplate %s/%s: %w", cd.Namespace, t.Name, err)
		}
		klog.FromContext(ctx).Info("Deleted the ResourceClaimTemplate of a deleted ComputeDomain", "domain", klog.KObj(cd), "template", t.Name)
	}
	if c.cliques != nil {
		prefix := string(cd.UID) + "."
		for _, obj := range c.cliques.GetStore().List() {
			u, ok := obj.(*unstructured.Unstructured)
			if !ok || !strings.HasPrefix(u.GetName(), prefix) {
				continue
			}
			err := c.cfg.DynamicClient.Resource(computedomain.CliqueGVR).Namespace(c.cfg.CliqueNamespace).Delete(ctx, u.GetName(), metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return fmt.Errorf("delete ComputeDomainClique %s/%s: %w", c.cfg.CliqueNamespace, u.GetName(), err)
			}
		}
	}
	claims, err := c.cfg.KubeClient.ResourceV1().ResourceClaims(cd.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list ResourceClaims of ComputeDomain %s/%s: %w", cd.Namespace, cd.Name, err)
	}
	var left []string
	for i := range claims.Items {
		if ClaimDomain(&claims.Items[i]) == string(cd.UID) {
			left = append(left, claims.Items[i].Name)
		}
	}
	if len(left) > 0 {
		return &WaitError{Reason: fmt.Sprintf("ComputeDomain %s/%s is deleted but %d ResourceClaim(s) of it remain (%s): its channel stays held until they are gone", cd.Namespace, cd.Name, len(left), strings.Join(left, ", ")), After: claimWait}
	}
	ops := []map[string]any{
		{"op": "test", "path": fmt.Sprintf("/metadata/finalizers/%d", i), "value": Finalizer},
		{"op": "remove", "path": fmt.Sprintf("/metadata/finalizers/%d", i)},
	}
	if err := c.patchMeta(ctx, cd, ops); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	c.mu.Lock()
	c.channels.Release(cd.UID)
	c.mu.Unlock()
	return nil
}

func (c *Controller) patchMeta(ctx context.Context, cd *v1beta1.ComputeDomain, ops []map[string]any) error {
	data, err := json.Marshal(ops)
	if err != nil {
		return err
	}
	obj, err := c.cfg.DynamicClient.Resource(computedomain.GVR).Namespace(cd.Namespace).Patch(ctx, cd.Name, types.JSONPatchType, data, metav1.PatchOptions{FieldManager: FieldManager})
	if err != nil {
		if apierrors.IsInvalid(err) || strings.Contains(err.Error(), "test operation") {
			return fmt.Errorf("patch finalizers of ComputeDomain %s/%s: changed meanwhile, retrying: %w", cd.Namespace, cd.Name, err)
		}
		return fmt.Errorf("patch finalizers of ComputeDomain %s/%s: %w", cd.Namespace, cd.Name, err)
	}
	updated, err := computedomain.FromUnstructured(obj)
	if err != nil {
		return err
	}
	*cd = *updated
	return nil
}

// ClaimDomain returns the domainID of the ComputeDomainChannelConfig a
// claim carries for the channel driver, or "" when it carries none.
func ClaimDomain(claim *resourceapi.ResourceClaim) string {
	for _, cfg := range claim.Spec.Devices.Config {
		if cfg.Opaque == nil || cfg.Opaque.Driver != computedomain.DriverName {
			continue
		}
		obj, err := v1beta1.DecodeLenient(cfg.Opaque.Parameters.Raw)
		if err != nil {
			continue
		}
		if ch, ok := obj.(*v1beta1.ComputeDomainChannelConfig); ok && ch.DomainID != "" {
			return ch.DomainID
		}
	}
	return ""
}
