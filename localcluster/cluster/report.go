package cluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpudra/gpudra/localcluster/manifests"
	"github.com/gpudra/gpudra/localcluster/realnode/probe"
	"github.com/gpudra/gpudra/localcluster/simnode"
)

// Report is what happened to the cluster's pods: gpudra-sim's --report.
type Report struct {
	Pods []PodReport `json:"pods"`
	// Workloads are the workload objects that no other controls
	// (Deployments, not their ReplicaSets), with how many pods each made.
	Workloads []WorkloadReport `json:"workloads"`
	// Refused are the objects the API server refused, set by whoever
	// applied them.
	Refused []manifests.Refusal `json:"refused"`
	// Nodes lists every node's device taints.
	Nodes []NodeReport `json:"nodes"`
	// ComputeDomains are the cluster's ComputeDomains, where the
	// ComputeDomain driver runs.
	ComputeDomains []ComputeDomainReport `json:"computeDomains,omitempty"`
}

// ComputeDomainReport is one ComputeDomain as its status has it.
type ComputeDomainReport struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Status is Ready or NotReady; Channel the IMEX channel the controller
	// assigned (-1: none yet).
	Status  string `json:"status"`
	Channel int    `json:"channel"`
	// NumNodes is spec.numNodes; Nodes the nodes in its status, by index.
	NumNodes int      `json:"numNodes"`
	Nodes    []string `json:"nodes"`
	// Reason says why a NotReady domain is not ready: its conditions'
	// reasons and messages (a field of its spec at fault), else how many
	// of its nodes are ready.
	Reason string `json:"reason,omitempty"`
}

// NodeReport is one node: what its ResourceSlices say about its devices'
// health (their device taints), and where its plugin serves metrics and
// probes.
type NodeReport struct {
	Name string `json:"name"`
	// Real is set on a real node (the real kubelet, containerd and runc).
	Real bool `json:"real,omitempty"`
	// HTTPEndpoint is the base URL of gpudra's kubelet plugin's HTTP
	// endpoint on the node (metrics at /metrics, probes at /livez,
	// /healthz and /readyz); "" on a node of gpudra's device plugin,
	// which serves none.
	HTTPEndpoint string              `json:"httpEndpoint,omitempty"`
	DeviceTaints []DeviceTaintReport `json:"deviceTaints"`
}

// DeviceTaintReport is one taint of one device.
type DeviceTaintReport struct {
	Device string `json:"device"`
	Key    string `json:"key"`
	Value  string `json:"value,omitempty"`
	Effect string `json:"effect"`
}

// PodReport is one pod.
type PodReport struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Phase     string `json:"phase"`
	Node      string `json:"node"`
	// Reason says why a pod is not Running: the scheduler's message, or
	// the node's preparation error.
	Reason     string            `json:"reason"`
	Claims     []ClaimReport     `json:"claims"`
	Containers []ContainerReport `json:"containers"`
	// Evicted is set on a pod a controller marked for deletion (the
	// device taint eviction controller, for a device with a NoExecute
	// taint); once it is deleted, the report keeps it as it was then.
	Evicted *EvictionReport `json:"evicted,omitempty"`
}

// ClaimReport is one of a pod's ResourceClaims and its allocation.
type ClaimReport struct {
	Name    string         `json:"name"`
	Results []DeviceResult `json:"results"`
}

// DeviceResult is one allocated device.
type DeviceResult struct {
	Request string `json:"request"`
	Driver  string `json:"driver"`
	Pool    string `json:"pool"`
	Device  string `json:"device"`
}

// ContainerReport is what one container was given.
type ContainerReport struct {
	Name        string            `json:"name"`
	CDIDevices  []string          `json:"cdiDevices"`
	Env         map[string]string `json:"env"`
	DeviceNodes []string          `json:"deviceNodes"`
	// Mounts are the container paths of the CDI edits' mounts.
	Mounts []string `json:"mounts"`
	// MPS are the MPS daemons the container is a client of, with their
	// caps; TimeSlices the time slices set on its GPUs.
	MPS        []simnode.MPSDaemon `json:"mps,omitempty"`
	TimeSlices []simnode.TimeSlice `json:"timeSlices,omitempty"`
	// Prepared is what the node's DRA manager prepared for the container.
	Prepared []simnode.PreparedClaim `json:"prepared,omitempty"`
	// Seen is what the container itself printed about its devices and
	// environment (package probe): on a real node, for a container that
	// runs the probe's command.
	Seen *probe.Seen `json:"seen,omitempty"`
	// AllocatedResourcesStatus is the health of the container's devices
	// as its pod status has it (KEP-4680): one entry per claim (and
	// request), "claim:<claim>/<request>", with each device's health.
	AllocatedResourcesStatus []corev1.ResourceStatus `json:"allocatedResourcesStatus,omitempty"`
}

// systemNamespace reports namespaces the report leaves out.
func systemNamespace(ns string) bool {
	return ns == metav1.NamespaceSystem || ns == metav1.NamespacePublic || ns == corev1.NamespaceNodeLease
}

// Report describes every pod outside the system namespaces, sorted by
// namespace and name.
func (c *Cluster) Report(ctx context.Context) (*Report, error) {
	pods, err := c.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	r := &Report{Pods: []PodReport{}, Refused: []manifests.Refusal{}}
	if r.Workloads, err = c.Workloads(ctx, false); err != nil {
		return nil, err
	}
	if r.Workloads == nil {
		r.Workloads = []WorkloadReport{}
	}
	var evicted map[types.UID]*EvictionReport
	if c.evictions != nil {
		var gone []PodReport
		evicted, gone = c.evictions.report()
		r.Pods = append(r.Pods, gone...)
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if systemNamespace(pod.Namespace) {
			continue
		}
		pr, err := c.podReport(ctx, pod)
		if err != nil {
			return nil, err
		}
		if ev := evicted[pod.UID]; ev != nil && !ev.Deleted {
			pr.Evicted = ev
		}
		r.Pods = append(r.Pods, pr)
	}
	slices.SortFunc(r.Pods, func(a, b PodReport) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	if r.Nodes, err = c.nodeReports(ctx); err != nil {
		return nil, err
	}
	if r.ComputeDomains, err = c.computeDomainReports(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// nodeReports lists each node's device taints from its ResourceSlices,
// nodes in fleet order (the real ones first), devices by name.
func (c *Cluster) nodeReports(ctx context.Context) ([]NodeReport, error) {
	list, err := c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	taints := map[string][]DeviceTaintReport{}
	for _, s := range list.Items {
		if s.Spec.NodeName == nil {
			continue
		}
		for _, d := range s.Spec.Devices {
			for _, t := range d.Taints {
				taints[*s.Spec.NodeName] = append(taints[*s.Spec.NodeName], DeviceTaintReport{Device: d.Name, Key: t.Key, Value: t.Value, Effect: string(t.Effect)})
			}
		}
	}
	out := []NodeReport{}
	for _, rn := range c.real {
		out = append(out, NodeReport{Name: rn.Name(), Real: true, HTTPEndpoint: c.realEndpoints[rn.Name()]})
	}
	for _, n := range c.nodes {
		out = append(out, NodeReport{Name: n.Name(), HTTPEndpoint: n.HTTPEndpoint()})
	}
	for i := range out {
		ts := taints[out[i].Name]
		slices.SortStableFunc(ts, func(a, b DeviceTaintReport) int { return strings.Compare(a.Device, b.Device) })
		if ts == nil {
			ts = []DeviceTaintReport{}
		}
		out[i].DeviceTaints = ts
	}
	return out, nil
}

func (c *Cluster) podReport(ctx context.Context, pod *corev1.Pod) (PodReport, error) {
	pr := PodReport{
		Namespace: pod.Namespace, Name: pod.Name, Phase: string(pod.Status.Phase), Node: pod.Spec.NodeName,
		Reason: PodReason(pod), Claims: []ClaimReport{}, Containers: []ContainerReport{},
	}
	var devices map[string]simnode.ContainerDevices
	if n := c.SimNode(pod.Spec.NodeName); n != nil {
		devices, _ = n.Containers(pod)
	}
	finished := pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
	if finished && devices != nil {
		// A finished pod's claims are unreserved and deallocated (and
		// the resource-claim controller may even have made new, unused
		// ones for it): report what the node prepared while it ran.
		pr.Claims = preparedClaims(pod, devices)
	} else {
		for _, name := range ClaimNames(pod) {
			cr := ClaimReport{Name: name, Results: []DeviceResult{}}
			claim, err := c.client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				return pr, err
			}
			if err == nil && claim.Status.Allocation != nil {
				for _, res := range claim.Status.Allocation.Devices.Results {
					cr.Results = append(cr.Results, DeviceResult{Request: res.Request, Driver: res.Driver, Pool: res.Pool, Device: res.Device})
				}
			}
			pr.Claims = append(pr.Claims, cr)
		}
	}
	for _, ctr := range pod.Spec.Containers {
		cr := ContainerReport{Name: ctr.Name, CDIDevices: []string{}, Env: map[string]string{}, DeviceNodes: []string{}, Mounts: []string{}}
		if d, ok := devices[ctr.Name]; ok {
			cr.CDIDevices = append(cr.CDIDevices, d.CDIDevices...)
			cr.DeviceNodes = append(cr.DeviceNodes, d.DeviceNodes...)
			cr.Mounts = append(cr.Mounts, d.Mounts...)
			cr.MPS, cr.TimeSlices = d.MPS, d.TimeSlices
			cr.Prepared = d.Claims
			for k, v := range d.Env {
				cr.Env[k] = v
			}
		}
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.Name == ctr.Name {
				cr.AllocatedResourcesStatus = cs.AllocatedResourcesStatus
			}
		}
		cr.Seen = c.seenInContainer(pod, ctr.Name)
		pr.Containers = append(pr.Containers, cr)
	}
	return pr, nil
}

// preparedClaims returns the claims the node prepared for the pod's
// containers, each once, in container order.
func preparedClaims(pod *corev1.Pod, devices map[string]simnode.ContainerDevices) []ClaimReport {
	out := []ClaimReport{}
	seen := map[string]bool{}
	for _, ctr := range pod.Spec.Containers {
		for _, pc := range devices[ctr.Name].Claims {
			if seen[pc.Name] {
				continue
			}
			seen[pc.Name] = true
			cr := ClaimReport{Name: pc.Name, Results: []DeviceResult{}}
			for _, d := range pc.Devices {
				for _, req := range d.Requests {
					cr.Results = append(cr.Results, DeviceResult{Request: req, Driver: d.Driver, Pool: d.Pool, Device: d.Device})
				}
			}
			out = append(out, cr)
		}
	}
	return out
}

// ClaimNames returns the names of the ResourceClaims a pod uses, in the
// order of its spec; claims from templates are named once the
// resource-claim controller has made them.
func ClaimNames(pod *corev1.Pod) []string {
	var names []string
	for _, pc := range pod.Spec.ResourceClaims {
		if pc.ResourceClaimName != nil {
			names = append(names, *pc.ResourceClaimName)
			continue
		}
		for _, s := range pod.Status.ResourceClaimStatuses {
			if s.Name == pc.Name && s.ResourceClaimName != nil {
				names = append(names, *s.ResourceClaimName)
			}
		}
	}
	// The claim the scheduler made for the pod's extended resources
	// (nvidia.com/gpu through a DeviceClass's extendedResourceName).
	if s := pod.Status.ExtendedResourceClaimStatus; s != nil && s.ResourceClaimName != "" {
		names = append(names, s.ResourceClaimName)
	}
	return names
}

// PodReason says why a pod is not running: the scheduler's message while
// it is unschedulable, else the first container's waiting message (the
// node's preparation error). Empty otherwise.
func PodReason(pod *corev1.Pod) string {
	if pod.Status.Phase != corev1.PodPending {
		return ""
	}
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse {
			return cond.Message
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Waiting != nil && cs.State.Waiting.Message != "" {
			return cs.State.Waiting.Message
		}
	}
	return ""
}

// settled reports whether a pod is where it will stay until something
// else changes: Running (and not about to finish), finished, or Pending
// with a reason.
func settled(pod *corev1.Pod) bool {
	switch pod.Status.Phase {
	case corev1.PodSucceeded, corev1.PodFailed:
		return true
	case corev1.PodRunning:
		_, finishing := pod.Annotations[simnode.RunForAnnotation]
		return !finishing
	default:
		return PodReason(pod) != ""
	}
}

// WaitSettled waits until every pod outside the system namespaces is
// settled (see above), every workload's controller has made the pods it
// will make (see WorkloadReport.Settled), and nothing about either has
// changed for quiet, or ctx ends. Its error then names what had not
// settled.
func (c *Cluster) WaitSettled(ctx context.Context, quiet time.Duration) error {
	// The quiet time starts now, not at some zero time: a first look
	// that finds nothing yet (the controllers have not made the pods of
	// the workloads just created) must not count as quiet already.
	last, since := "", time.Now()
	var pending []string
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		pods, err := c.client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		workloads, err := c.Workloads(ctx, true)
		if err != nil {
			return false, nil
		}
		var sig strings.Builder
		pending = pending[:0]
		for _, w := range workloads {
			fmt.Fprintf(&sig, "%+v;", w)
			if !w.Settled {
				pending = append(pending, fmt.Sprintf("%s: %s", w, w.Message))
			}
		}
		for i := range pods.Items {
			pod := &pods.Items[i]
			if systemNamespace(pod.Namespace) {
				continue
			}
			fmt.Fprintf(&sig, "%s/%s;", pod.UID, pod.ResourceVersion)
			if !settled(pod) {
				why := string(pod.Status.Phase)
				if pod.Status.Phase == corev1.PodRunning {
					why += " until its " + simnode.RunForAnnotation + " time is up"
				}
				pending = append(pending, fmt.Sprintf("pod %s/%s: %s", pod.Namespace, pod.Name, why))
			}
		}
		if sig.String() != last {
			last, since = sig.String(), time.Now()
			return false, nil
		}
		return len(pending) == 0 && time.Since(since) >= quiet, nil
	})
	if err != nil && len(pending) > 0 {
		const show = 5
		more := ""
		if len(pending) > show {
			more = fmt.Sprintf(" and %d more", len(pending)-show)
		}
		return fmt.Errorf("%w; not settled: %s%s", err, strings.Join(pending[:min(show, len(pending))], "; "), more)
	}
	return err
}

// AllocatedDevices returns the devices of a pod's claims with their
// published attributes, looked up in the ResourceSlices.
func (c *Cluster) AllocatedDevices(ctx context.Context, pod *corev1.Pod) ([]resourceapi.Device, error) {
	slices, err := c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	byKey := map[string]resourceapi.Device{}
	for _, s := range slices.Items {
		for _, d := range s.Spec.Devices {
			byKey[s.Spec.Driver+"/"+s.Spec.Pool.Name+"/"+d.Name] = d
		}
	}
	var out []resourceapi.Device
	for _, name := range ClaimNames(pod) {
		claim, err := c.client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		if claim.Status.Allocation == nil {
			continue
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			d, ok := byKey[r.Driver+"/"+r.Pool+"/"+r.Device]
			if !ok {
				return nil, fmt.Errorf("claim %s: device %s/%s/%s is in no ResourceSlice", name, r.Driver, r.Pool, r.Device)
			}
			out = append(out, d)
		}
	}
	return out, nil
}
