package cluster

import (
	"context"
	"fmt"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// EvictionReport says why a controller deleted a pod: the DisruptionTarget
// condition it set first, and, for the device taint eviction controller,
// the NoExecute taints of the pod's devices then.
type EvictionReport struct {
	Reason  string `json:"reason"`
	Message string `json:"message"`
	// Taints are the NoExecute taints of the pod's allocated devices when
	// the device taint eviction controller marked the pod.
	Taints []DeviceTaintReport `json:"taints,omitempty"`
	// Deleted is set once the pod is gone from the API server.
	Deleted bool `json:"deleted"`
}

// deviceTaintEvictionReason is the DisruptionTarget reason of kube's
// device taint eviction controller.
const deviceTaintEvictionReason = "DeletionByDeviceTaintManager"

// evictions watches the pods for the DisruptionTarget condition a
// controller sets before deleting one (the device taint eviction
// controller for a GPU with a NoExecute taint), and keeps what the pod
// was then: the report would otherwise lose an evicted pod without a
// word.
type evictions struct {
	c       *Cluster
	ctx     context.Context
	cancel  context.CancelFunc
	factory informers.SharedInformerFactory

	mu   sync.Mutex
	pods map[types.UID]PodReport
}

// startEvictions starts watching the cluster's pods.
func (c *Cluster) startEvictions(ctx context.Context) error {
	e := &evictions{c: c, pods: map[types.UID]PodReport{}, factory: informers.NewSharedInformerFactory(c.client, 0)}
	e.ctx, e.cancel = context.WithCancel(context.WithoutCancel(ctx))
	_, err := e.factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { e.seen(obj, false) },
		UpdateFunc: func(_, obj any) { e.seen(obj, false) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			e.seen(obj, true)
		},
	})
	if err != nil {
		return err
	}
	e.factory.Start(e.ctx.Done())
	c.evictions = e
	return nil
}

func (e *evictions) stop() {
	e.cancel()
	e.factory.Shutdown()
}

// disruption returns the pod's DisruptionTarget condition, nil if it has
// none that is true.
func disruption(pod *corev1.Pod) *corev1.PodCondition {
	for i, cond := range pod.Status.Conditions {
		if cond.Type == corev1.DisruptionTarget && cond.Status == corev1.ConditionTrue {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// seen records a pod marked for deletion, as it is when first seen so
// (its claims still allocated), and marks it deleted once it is gone.
func (e *evictions) seen(obj any, deleted bool) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || systemNamespace(pod.Namespace) {
		return
	}
	cond := disruption(pod)
	e.mu.Lock()
	pr, known := e.pods[pod.UID]
	e.mu.Unlock()
	if cond == nil && !known {
		return
	}
	if !known {
		var err error
		if pr, err = e.c.podReport(e.ctx, pod); err != nil {
			klog.FromContext(e.ctx).V(2).Info("Report of an evicted pod", "pod", klog.KObj(pod), "err", err)
		}
		ev := &EvictionReport{Reason: cond.Reason, Message: cond.Message}
		if cond.Reason == deviceTaintEvictionReason {
			ev.Taints = e.c.noExecuteTaints(e.ctx, pr.Claims)
		}
		pr.Evicted = ev
	}
	if deleted {
		ev := *pr.Evicted
		ev.Deleted = true
		pr.Evicted = &ev
		pr.Reason = evictionReason(&ev)
	}
	e.mu.Lock()
	e.pods[pod.UID] = pr
	e.mu.Unlock()
}

// evictionReason says for people why the pod is gone.
func evictionReason(ev *EvictionReport) string {
	var b strings.Builder
	fmt.Fprintf(&b, "evicted (deleted): %s", ev.Reason)
	if ev.Message != "" {
		fmt.Fprintf(&b, " (%s)", ev.Message)
	}
	for i, t := range ev.Taints {
		sep := ", "
		if i == 0 {
			sep = "; device taints: "
		}
		fmt.Fprintf(&b, "%s%s %s=%s:%s", sep, t.Device, t.Key, t.Value, t.Effect)
	}
	return b.String()
}

// noExecuteTaints returns the NoExecute taints the ResourceSlices give the
// claims' devices now.
func (c *Cluster) noExecuteTaints(ctx context.Context, claims []ClaimReport) []DeviceTaintReport {
	list, err := c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	var out []DeviceTaintReport
	for _, cr := range claims {
		for _, res := range cr.Results {
			for _, s := range list.Items {
				if s.Spec.Driver != res.Driver || s.Spec.Pool.Name != res.Pool {
					continue
				}
				for _, d := range s.Spec.Devices {
					if d.Name != res.Device {
						continue
					}
					for _, t := range d.Taints {
						if t.Effect == "NoExecute" {
							out = append(out, DeviceTaintReport{Device: d.Name, Key: t.Key, Value: t.Value, Effect: string(t.Effect)})
						}
					}
				}
			}
		}
	}
	return out
}

// report returns the evicted pods: those still in the API server by UID,
// and those gone.
func (e *evictions) report() (byUID map[types.UID]*EvictionReport, gone []PodReport) {
	e.mu.Lock()
	defer e.mu.Unlock()
	byUID = map[types.UID]*EvictionReport{}
	for uid, pr := range e.pods {
		byUID[uid] = pr.Evicted
		if pr.Evicted.Deleted {
			gone = append(gone, pr)
		}
	}
	return byUID, gone
}
