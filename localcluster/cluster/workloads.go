package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// WorkloadReport is one workload object (Deployment, ReplicaSet,
// StatefulSet, Job, and the kinds the local cluster stores but runs no
// controller for): how many pods it asks for and how many its controller
// has made.
type WorkloadReport struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Desired is how many pods it asks for: spec.replicas, or a Job's
	// completions (its parallelism when it has no completions).
	Desired int32 `json:"desired"`
	// Pods is how many of its pods exist (status.replicas; a Job's
	// active, succeeded and failed pods).
	Pods int32 `json:"pods"`
	// Settled says its controller has made what it will make until
	// something else changes: all its pods, or as many as it can (a
	// StatefulSet waiting for a pod to become ready, a controller that
	// reports a failure, a finished or suspended Job).
	Settled bool `json:"settled"`
	// Unsupported says that no controller in the local cluster acts on
	// objects of this kind: they make no pods.
	Unsupported bool `json:"unsupported,omitempty"`
	// Message says why it is settled short of Desired, or why it is not
	// settled yet.
	Message string `json:"message,omitempty"`
}

// String is "Kind namespace/name".
func (w WorkloadReport) String() string {
	return fmt.Sprintf("%s %s/%s", w.Kind, w.Namespace, w.Name)
}

// controllerFor maps workload kinds to the name of the controller that
// acts on them (as kube-controller-manager's --controllers names it).
var controllerFor = map[string]string{
	"Deployment":            "deployment",
	"ReplicaSet":            "replicaset",
	"StatefulSet":           "statefulset",
	"Job":                   "job",
	"DaemonSet":             "daemonset",
	"ReplicationController": "replicationcontroller",
	"CronJob":               "cronjob",
}

// Workloads reports every workload object outside the system namespaces,
// sorted by namespace, name and kind. Objects another workload controls
// (a Deployment's ReplicaSets) are included when all is true.
func (c *Cluster) Workloads(ctx context.Context, all bool) ([]WorkloadReport, error) {
	running := c.cp.Controllers()
	var out []WorkloadReport
	add := func(meta metav1.ObjectMeta, w WorkloadReport) {
		if systemNamespace(meta.Namespace) || (!all && metav1.GetControllerOf(&meta) != nil) {
			return
		}
		w.Namespace, w.Name = meta.Namespace, meta.Name
		if !slices.Contains(running, controllerFor[w.Kind]) {
			w.Settled, w.Unsupported = true, true
			w.Message = fmt.Sprintf("unsupported: the local cluster runs no %s controller, so nothing makes its pods", controllerFor[w.Kind])
		}
		out = append(out, w)
	}
	apps, batch, core := c.client.AppsV1(), c.client.BatchV1(), c.client.CoreV1()

	deployments, err := apps.Deployments("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range deployments.Items {
		d := &deployments.Items[i]
		add(d.ObjectMeta, deploymentReport(d))
	}
	replicaSets, err := apps.ReplicaSets("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range replicaSets.Items {
		rs := &replicaSets.Items[i]
		add(rs.ObjectMeta, replicaSetReport(rs))
	}
	statefulSets, err := apps.StatefulSets("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range statefulSets.Items {
		s := &statefulSets.Items[i]
		add(s.ObjectMeta, statefulSetReport(s))
	}
	jobs, err := batch.Jobs("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range jobs.Items {
		j := &jobs.Items[i]
		add(j.ObjectMeta, jobReport(j))
	}
	daemonSets, err := apps.DaemonSets("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range daemonSets.Items {
		d := &daemonSets.Items[i]
		add(d.ObjectMeta, daemonSetReport(d))
	}
	rcs, err := core.ReplicationControllers("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range rcs.Items {
		rc := &rcs.Items[i]
		add(rc.ObjectMeta, WorkloadReport{Kind: "ReplicationController", Desired: ptr.Deref(rc.Spec.Replicas, 1), Pods: rc.Status.Replicas})
	}
	cronJobs, err := batch.CronJobs("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range cronJobs.Items {
		add(cronJobs.Items[i].ObjectMeta, WorkloadReport{Kind: "CronJob"})
	}
	slices.SortFunc(out, func(a, b WorkloadReport) int {
		return strings.Compare(a.Namespace+"/"+a.Name+"/"+a.Kind, b.Namespace+"/"+b.Name+"/"+b.Kind)
	})
	return out, nil
}

// A controller that has not seen the latest spec yet has not acted on it.
func caughtUp(m metav1.ObjectMeta, observed int64) bool { return observed >= m.Generation }

// daemonSetReport says whether a DaemonSet (the chart's, on real nodes)
// has its pod on every node it selects, of its current revision.
func daemonSetReport(d *appsv1.DaemonSet) WorkloadReport {
	w := WorkloadReport{Kind: "DaemonSet", Desired: d.Status.DesiredNumberScheduled, Pods: d.Status.CurrentNumberScheduled}
	switch {
	case !caughtUp(d.ObjectMeta, d.Status.ObservedGeneration):
		w.Message = "the daemonset controller has not seen its latest spec"
	case d.Status.UpdatedNumberScheduled == w.Desired && d.Status.CurrentNumberScheduled == w.Desired && d.Status.NumberMisscheduled == 0:
		w.Settled = true
	default:
		w.Message = fmt.Sprintf("%d of %d nodes have a pod of the current revision", d.Status.UpdatedNumberScheduled, w.Desired)
	}
	return w
}

func deploymentReport(d *appsv1.Deployment) WorkloadReport {
	w := WorkloadReport{Kind: "Deployment", Desired: ptr.Deref(d.Spec.Replicas, 1), Pods: d.Status.Replicas}
	switch {
	case !caughtUp(d.ObjectMeta, d.Status.ObservedGeneration):
		w.Message = "the deployment controller has not seen its latest spec"
	case d.Spec.Paused:
		w.Settled, w.Message = true, "paused"
	case d.Status.UpdatedReplicas == w.Desired && d.Status.Replicas == w.Desired:
		w.Settled = true
	default:
		w.Message = fmt.Sprintf("%d of %d pods of the current revision, %d in all", d.Status.UpdatedReplicas, w.Desired, d.Status.Replicas)
		for _, cond := range d.Status.Conditions {
			stuck := cond.Type == appsv1.DeploymentReplicaFailure && cond.Status == corev1.ConditionTrue ||
				cond.Type == appsv1.DeploymentProgressing && cond.Status == corev1.ConditionFalse
			if stuck {
				w.Settled, w.Message = true, cond.Message
			}
		}
	}
	return w
}

func replicaSetReport(rs *appsv1.ReplicaSet) WorkloadReport {
	w := WorkloadReport{Kind: "ReplicaSet", Desired: ptr.Deref(rs.Spec.Replicas, 1), Pods: rs.Status.Replicas}
	switch {
	case !caughtUp(rs.ObjectMeta, rs.Status.ObservedGeneration):
		w.Message = "the replicaset controller has not seen its latest spec"
	case rs.Status.Replicas == w.Desired:
		w.Settled = true
	default:
		w.Message = fmt.Sprintf("%d of %d pods", rs.Status.Replicas, w.Desired)
		for _, cond := range rs.Status.Conditions {
			if cond.Type == appsv1.ReplicaSetReplicaFailure && cond.Status == corev1.ConditionTrue {
				w.Settled, w.Message = true, cond.Message
			}
		}
	}
	return w
}

func statefulSetReport(s *appsv1.StatefulSet) WorkloadReport {
	w := WorkloadReport{Kind: "StatefulSet", Desired: ptr.Deref(s.Spec.Replicas, 1), Pods: s.Status.Replicas}
	ordered := s.Spec.PodManagementPolicy != appsv1.ParallelPodManagement
	switch {
	case !caughtUp(s.ObjectMeta, s.Status.ObservedGeneration):
		w.Message = "the statefulset controller has not seen its latest spec"
	case s.Status.Replicas == w.Desired:
		w.Settled = true
	case ordered && s.Status.ReadyReplicas < s.Status.Replicas:
		// OrderedReady makes the next pod only once the ones before it
		// are ready; whether the one it waits for ever will is that pod's
		// story, which the pod's row tells.
		start := int32(0)
		if s.Spec.Ordinals != nil {
			start = s.Spec.Ordinals.Start
		}
		w.Settled = true
		w.Message = fmt.Sprintf("%d of %d pods: the next waits until %s-%d is ready", s.Status.Replicas, w.Desired, s.Name, start+s.Status.ReadyReplicas)
	default:
		w.Message = fmt.Sprintf("%d of %d pods", s.Status.Replicas, w.Desired)
	}
	return w
}

func jobReport(j *batchv1.Job) WorkloadReport {
	parallelism := ptr.Deref(j.Spec.Parallelism, 1)
	w := WorkloadReport{Kind: "Job", Desired: parallelism, Pods: j.Status.Active + j.Status.Succeeded + j.Status.Failed}
	// Without completions, the first success ends the Job; with them,
	// it keeps up to parallelism pods running until enough succeeded.
	wantActive := parallelism
	if j.Spec.Completions != nil {
		w.Desired = *j.Spec.Completions
		wantActive = min(parallelism, max(0, *j.Spec.Completions-j.Status.Succeeded))
	} else if j.Status.Succeeded > 0 {
		wantActive = 0
	}
	for _, cond := range j.Status.Conditions {
		if (cond.Type == batchv1.JobComplete || cond.Type == batchv1.JobFailed) && cond.Status == corev1.ConditionTrue {
			w.Settled = true
			if cond.Type == batchv1.JobFailed {
				w.Message = "failed: " + cond.Message
			}
			return w
		}
	}
	switch {
	case ptr.Deref(j.Spec.Suspend, false):
		w.Settled, w.Message = true, "suspended"
	case parallelism == 0:
		w.Settled, w.Message = true, "parallelism 0"
	case j.Status.Active >= wantActive && wantActive > 0:
		w.Settled = true
	default:
		w.Message = fmt.Sprintf("%d pods active, %d succeeded, %d failed; the job controller is to run %d", j.Status.Active, j.Status.Succeeded, j.Status.Failed, wantActive)
	}
	return w
}
