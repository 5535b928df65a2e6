package simnode

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/utils/ptr"
)

// RunForAnnotation makes a pod succeed after the given duration
// (time.ParseDuration syntax) once it runs, so that Jobs complete.
const RunForAnnotation = "sim.gpudra.io/run-for"

// podState is what the loop knows about one pod of its node.
type podState struct {
	pod      *corev1.Pod
	deleted  bool // gone from the API server
	prepared bool // PrepareResources succeeded and not undone since
	running  bool // marked Running by this loop
	waitMsg  string
	// containers holds the resolved CDI edits per container.
	containers map[string]ContainerDevices
}

// podLoop stands in for the kubelet's pod workers: it prepares a bound
// pod's claims through the DRA manager, marks it Running (Succeeded after
// its run-for time), and unprepares when the pod ends or goes away.
type podLoop struct {
	// prepareFailures and unprepareFailures count the kubelet's failed
	// PrepareResources and UnprepareResources calls (each is retried).
	prepareFailures, unprepareFailures atomic.Int64

	n        *Node
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[types.UID]
	cdi      *cdiResolver
	wg       sync.WaitGroup

	mu   sync.Mutex
	pods map[types.UID]*podState

	sourcesReady config.SourcesReady
}

func newPodLoop(n *Node) *podLoop {
	l := &podLoop{
		n:    n,
		pods: map[types.UID]*podState{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[types.UID](50*time.Millisecond, 5*time.Second),
			workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: "simnode-" + n.cfg.Name}),
		cdi: newCDIResolver(n.cfg.CDIDir()),
	}
	l.factory = informers.NewSharedInformerFactoryWithOptions(n.cfg.KubeletClient, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", n.cfg.Name).String()
		}))
	l.informer = l.factory.Core().V1().Pods().Informer()
	_, _ = l.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { l.observe(obj, false) },
		UpdateFunc: func(_, obj any) { l.observe(obj, false) },
		DeleteFunc: func(obj any) {
			if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = tomb.Obj
			}
			l.observe(obj, true)
		},
	})
	l.sourcesReady = config.NewSourcesReady(func(sets.Set[string]) bool { return l.informer.HasSynced() })
	return l
}

func (l *podLoop) observe(obj any, deleted bool) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	l.mu.Lock()
	st := l.pods[pod.UID]
	if st == nil {
		st = &podState{}
		l.pods[pod.UID] = st
	}
	st.pod = pod
	st.deleted = st.deleted || deleted
	l.mu.Unlock()
	l.queue.Add(pod.UID)
}

func (l *podLoop) start(ctx context.Context) {
	l.factory.Start(ctx.Done())
	// The DRA manager names the pods whose devices' health changed, as it
	// does for the kubelet's sync loop; their status is written again.
	l.wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case u := <-l.n.manager.Updates():
				for _, uid := range u.PodUIDs {
					l.queue.Add(types.UID(uid))
				}
			}
		}
	})
	for range l.n.cfg.Workers {
		l.wg.Go(func() {
			for l.processNext(ctx) {
			}
		})
	}
}

func (l *podLoop) stop() {
	l.queue.ShutDown()
	l.n.cancel()
	l.wg.Wait()
	l.factory.Shutdown()
}

func (l *podLoop) processNext(ctx context.Context) bool {
	uid, quit := l.queue.Get()
	if quit {
		return false
	}
	defer l.queue.Done(uid)
	requeueAfter, err := l.sync(ctx, uid)
	switch {
	case err != nil && ctx.Err() == nil:
		klog.FromContext(ctx).V(2).Info("Pod sync failed, will retry", "podUID", uid, "err", err)
		l.queue.AddRateLimited(uid)
	case requeueAfter > 0:
		l.queue.Forget(uid)
		l.queue.AddAfter(uid, requeueAfter)
	default:
		l.queue.Forget(uid)
	}
	return true
}

// activePods is the DRA manager's view of the pods that still need their
// claims: not gone, not terminal, not being deleted.
func (l *podLoop) activePods() []*corev1.Pod {
	l.mu.Lock()
	defer l.mu.Unlock()
	var pods []*corev1.Pod
	for _, st := range l.pods {
		if !st.deleted && !terminal(st.pod) && st.pod.DeletionTimestamp == nil {
			pods = append(pods, st.pod)
		}
	}
	return pods
}

func (l *podLoop) containers(uid types.UID) (map[string]ContainerDevices, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.pods[uid]
	if st == nil || st.containers == nil {
		return nil, false
	}
	return st.containers, true
}

// podByName returns a copy of the state of the node's pod with this
// namespace and name; of a deleted pod and its successor of the same
// name, the successor.
func (l *podLoop) podByName(namespace, name string) (podState, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var found *podState
	for _, st := range l.pods {
		if st.pod.Namespace != namespace || st.pod.Name != name {
			continue
		}
		if found == nil || found.deleted && !st.deleted {
			found = st
		}
	}
	if found == nil {
		return podState{}, false
	}
	return *found, true
}

func terminal(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// snapshot returns a copy of a pod's state for one sync.
func (l *podLoop) snapshot(uid types.UID) (podState, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.pods[uid]
	if st == nil {
		return podState{}, false
	}
	return *st, true
}

func (l *podLoop) update(uid types.UID, f func(*podState)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if st := l.pods[uid]; st != nil {
		f(st)
	}
}

// sync moves one pod one step on; it returns when to look again.
func (l *podLoop) sync(ctx context.Context, uid types.UID) (time.Duration, error) {
	st, ok := l.snapshot(uid)
	if !ok {
		return 0, nil
	}
	pod := st.pod
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(pod))
	ctx = klog.NewContext(ctx, logger)
	manager := l.n.manager

	switch {
	case st.deleted || pod.DeletionTimestamp != nil:
		// The containers "stop" at once; then the claims are released
		// and the pod object removed, as the kubelet does.
		if err := manager.UnprepareResources(ctx, pod); err != nil {
			l.unprepareFailures.Add(1)
			return 0, err
		}
		if st.deleted {
			l.mu.Lock()
			delete(l.pods, uid)
			l.mu.Unlock()
			return 0, nil
		}
		l.update(uid, func(s *podState) { s.prepared = false })
		err := l.n.cfg.KubeletClient.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: ptr.To[int64](0),
			Preconditions:      metav1.NewUIDPreconditions(string(uid)),
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return 0, fmt.Errorf("delete pod: %w", err)
		}
		return 0, nil

	case terminal(pod):
		if st.prepared || manager.PodMightNeedToUnprepareResources(uid) {
			if err := manager.UnprepareResources(ctx, pod); err != nil {
				l.unprepareFailures.Add(1)
				return 0, err
			}
			l.update(uid, func(s *podState) { s.prepared = false })
			logger.V(2).Info("Pod finished, claims unprepared", "phase", pod.Status.Phase)
		}
		return 0, nil

	case pod.Status.Phase == corev1.PodRunning || st.running:
		if err := l.refreshHealth(ctx, pod); err != nil {
			return 0, err
		}
		return l.maybeFinish(ctx, pod)

	default:
		return l.startPod(ctx, pod)
	}
}

// startPod prepares the pod's claims, resolves its containers' CDI
// devices and marks it Running.
func (l *podLoop) startPod(ctx context.Context, pod *corev1.Pod) (time.Duration, error) {
	manager := l.n.manager
	// On a device-plugin node the device manager allocates the
	// containers' extended resources first, as the kubelet's admission
	// does.
	dm := l.n.deviceManager()
	if dm != nil {
		if err := l.n.admit(ctx, dm, pod); err != nil {
			l.waiting(ctx, pod, err)
			return 0, err
		}
	}
	if err := manager.PrepareResources(ctx, pod); err != nil {
		l.prepareFailures.Add(1)
		l.waiting(ctx, pod, err)
		return 0, err
	}
	l.update(pod.UID, func(s *podState) { s.prepared = true })
	containers := map[string]ContainerDevices{}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		info, err := manager.GetResources(pod, c)
		if err != nil {
			l.waiting(ctx, pod, err)
			return 0, err
		}
		var ids []string
		for _, d := range info.CDIDevices {
			ids = append(ids, d.Name)
		}
		var dpEnv map[string]string
		if dm != nil {
			opts, err := dm.GetDeviceRunContainerOptions(ctx, pod, c)
			if err != nil {
				l.waiting(ctx, pod, err)
				return 0, err
			}
			if opts != nil {
				for _, d := range opts.CDIDevices {
					ids = append(ids, d.Name)
				}
				dpEnv = map[string]string{}
				for _, e := range opts.Envs {
					dpEnv[e.Name] = e.Value
				}
			}
		}
		devs, mounts, err := l.cdi.resolve(ids)
		if err != nil {
			err = fmt.Errorf("container %s: %w", c.Name, err)
			l.waiting(ctx, pod, err)
			return 0, err
		}
		infos, err := manager.GetContainerClaimInfos(pod, c)
		if err != nil {
			l.waiting(ctx, pod, err)
			return 0, err
		}
		for _, info := range infos {
			pc := PreparedClaim{Name: info.ClaimName}
			for driver, ds := range info.DriverState {
				for _, d := range ds.Devices {
					pc.Devices = append(pc.Devices, PreparedDevice{Requests: slices.Clone(d.RequestNames), Driver: driver, Pool: d.PoolName, Device: d.DeviceName})
				}
			}
			devs.Claims = append(devs.Claims, pc)
		}
		if devs.MPS, devs.TimeSlices, err = l.n.sharingOf(ctx, mounts, devs.Claims); err != nil {
			err = fmt.Errorf("container %s: %w", c.Name, err)
			l.waiting(ctx, pod, err)
			return 0, err
		}
		for k, v := range dpEnv {
			if devs.Env == nil {
				devs.Env = map[string]string{}
			}
			devs.Env[k] = v
		}
		containers[c.Name] = devs
	}

	now := metav1.Now()
	updated := pod.DeepCopy()
	s := &updated.Status
	s.Phase = corev1.PodRunning
	s.StartTime = &now
	s.HostIP = "127.0.0.1"
	s.HostIPs = []corev1.HostIP{{IP: "127.0.0.1"}}
	for _, t := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		setCondition(s, corev1.PodCondition{Type: t, Status: corev1.ConditionTrue, LastTransitionTime: now})
	}
	s.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		s.ContainerStatuses = append(s.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "sim://" + c.Image, ContainerID: "sim://" + string(pod.UID) + "/" + c.Name,
			Ready: true, Started: ptr.To(true),
			State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	l.allocatedResourcesStatus(ctx, updated)
	// What the containers got is on record before anyone can see the pod
	// Running.
	l.update(pod.UID, func(st *podState) { st.containers = containers })
	if _, err := l.n.cfg.KubeletClient.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
		return 0, fmt.Errorf("mark pod running: %w", err)
	}
	l.update(pod.UID, func(st *podState) { st.running = true })
	klog.FromContext(ctx).V(2).Info("Pod running", "containers", len(containers))
	return l.runFor(pod, now.Time)
}

// runFor says how long until a running pod with the run-for annotation is
// due to succeed (0: never, or now if negative is reported as 1ns).
func (l *podLoop) runFor(pod *corev1.Pod, started time.Time) (time.Duration, error) {
	v, ok := pod.Annotations[RunForAnnotation]
	if !ok {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		l.n.recorder.Eventf(pod, corev1.EventTypeWarning, "BadAnnotation", "%s: %v", RunForAnnotation, err)
		return 0, nil
	}
	left := time.Until(started.Add(d))
	if left <= 0 {
		left = time.Nanosecond
	}
	return left, nil
}

// maybeFinish marks a running pod Succeeded once its run-for time is up.
func (l *podLoop) maybeFinish(ctx context.Context, pod *corev1.Pod) (time.Duration, error) {
	if _, ok := pod.Annotations[RunForAnnotation]; !ok || pod.Status.Phase != corev1.PodRunning {
		return 0, nil
	}
	started := time.Now()
	if pod.Status.StartTime != nil {
		started = pod.Status.StartTime.Time
	}
	if left, _ := l.runFor(pod, started); left > time.Millisecond {
		return left, nil
	}
	now := metav1.Now()
	updated := pod.DeepCopy()
	s := &updated.Status
	s.Phase = corev1.PodSucceeded
	for _, t := range []corev1.PodConditionType{corev1.ContainersReady, corev1.PodReady} {
		setCondition(s, corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, Reason: "PodCompleted", LastTransitionTime: now})
	}
	for i := range s.ContainerStatuses {
		cs := &s.ContainerStatuses[i]
		startedAt := now
		if cs.State.Running != nil {
			startedAt = cs.State.Running.StartedAt
		}
		cs.Ready, cs.Started = false, ptr.To(false)
		cs.State = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 0, Reason: "Completed", StartedAt: startedAt, FinishedAt: now, ContainerID: cs.ContainerID,
		}}
	}
	l.allocatedResourcesStatus(ctx, updated)
	if _, err := l.n.cfg.KubeletClient.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
		return 0, fmt.Errorf("mark pod succeeded: %w", err)
	}
	return 0, nil
}

// allocatedResourcesStatus sets the health of the devices each container
// uses (status.containerStatuses[].allocatedResourcesStatus, KEP-4680)
// from what the node's plugin reported to the DRA manager, with the
// manager's own code, as the kubelet does whenever it writes a pod's
// status. The manager builds the list from a map; it is sorted here so
// that an unchanged health compares equal.
func (l *podLoop) allocatedResourcesStatus(ctx context.Context, pod *corev1.Pod) {
	l.n.manager.UpdateAllocatedResourcesStatus(klog.FromContext(ctx), pod, &pod.Status)
	for i := range pod.Status.ContainerStatuses {
		rs := pod.Status.ContainerStatuses[i].AllocatedResourcesStatus
		slices.SortFunc(rs, func(a, b corev1.ResourceStatus) int { return strings.Compare(string(a.Name), string(b.Name)) })
		for j := range rs {
			slices.SortFunc(rs[j].Resources, func(a, b corev1.ResourceHealth) int {
				return strings.Compare(string(a.ResourceID), string(b.ResourceID))
			})
		}
	}
}

// refreshHealth writes a running pod's status again when the health of
// its devices changed.
func (l *podLoop) refreshHealth(ctx context.Context, pod *corev1.Pod) error {
	if pod.Status.Phase != corev1.PodRunning {
		return nil
	}
	updated := pod.DeepCopy()
	l.allocatedResourcesStatus(ctx, updated)
	if equality.Semantic.DeepEqual(updated.Status.ContainerStatuses, pod.Status.ContainerStatuses) {
		return nil
	}
	if _, err := l.n.cfg.KubeletClient.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("update the health of the pod's devices: %w", err)
	}
	klog.FromContext(ctx).V(2).Info("Pod's device health updated")
	return nil
}

// waiting reports why a pod cannot start, as the kubelet does: an event,
// and the message in the containers' waiting state.
func (l *podLoop) waiting(ctx context.Context, pod *corev1.Pod, cause error) {
	msg := cause.Error()
	var same bool
	l.update(pod.UID, func(s *podState) { same = s.waitMsg == msg; s.waitMsg = msg })
	if same {
		return
	}
	l.n.recorder.Event(pod, corev1.EventTypeWarning, "FailedPrepareDynamicResources", msg)
	updated := pod.DeepCopy()
	updated.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		updated.Status.ContainerStatuses = append(updated.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating", Message: msg}},
		})
	}
	if _, err := l.n.cfg.KubeletClient.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
		klog.FromContext(ctx).V(2).Info("Recording the waiting reason failed", "err", err)
		l.update(pod.UID, func(s *podState) { s.waitMsg = "" })
	}
}

func setCondition(s *corev1.PodStatus, c corev1.PodCondition) {
	for i := range s.Conditions {
		if s.Conditions[i].Type == c.Type {
			if s.Conditions[i].Status == c.Status {
				return
			}
			s.Conditions[i] = c
			return
		}
	}
	s.Conditions = append(s.Conditions, c)
}
