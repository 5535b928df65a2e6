package cdbench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/computedomain"
	"github.com/gpudra/gpudra/pkg/simfleet"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/controlplane"
	"github.com/gpudra/gpudra/localcluster/manifests"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// domainYAML is a ComputeDomain of %[2]d nodes in namespace %[1]s.
const domainYAML = `
apiVersion: v1
kind: Namespace
metadata:
  name: %[1]s
---
apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata:
  name: bench
  namespace: %[1]s
spec:
  numNodes: %[2]d
  channel:
    resourceClaimTemplate:
      name: bench-channel
`

// podYAML is pod %[2]s of the domain in namespace %[1]s, pinned to node
// %[3]s by affinity (the scheduler still binds it and allocates its
// claim).
const podYAML = `
apiVersion: v1
kind: Pod
metadata:
  name: %[2]s
  namespace: %[1]s
spec:
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchFields:
          - key: metadata.name
            operator: In
            values: [%[3]s]
  containers:
  - name: ctr
    image: ubuntu:22.04
    command: ["sleep", "infinity"]
    resources:
      claims:
      - name: channel
  resourceClaims:
  - name: channel
    resourceClaimTemplateName: bench-channel
`

// BenchmarkComputeDomain18Nodes: on the gb200-nvl72 fleet (18 trays of 4
// GB200, one clique), with the channel plugin on every node supervising a
// fake nvidia-imex that runs as a process, one ComputeDomain with
// numNodes 18 and 18 pods, one per tray, each with the domain's channel
// claim, all created at once. Every run starts cold: no IMEX daemon runs
// (they stop 2 s after their last claim). Reported, as means over the
// runs: time from creation to all pods Running and to the domain Ready;
// each pod's wait from bound (spec.nodeName set) to Running, p50 and max
// (every pod is the first on its node, so this is the first pod's wait);
// ComputeDomainClique writes and index registry (ConfigMap) writes per
// node joining, from the API server's request counts.
func BenchmarkComputeDomain18Nodes(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fleet, err := simfleet.Load("gb200-nvl72")
	if err != nil {
		b.Fatal(err)
	}
	dir := clustertest.ShortTempDir(b)
	// The chart's ComputeDomain driver runs with the cluster's fake daemon;
	// a daemon no claim holds stops after 2 s, so that every run starts
	// cold.
	c, err := cluster.Start(ctx, cluster.Options{Fleet: fleet, Dir: dir,
		ChartValues: map[string]any{"computeDomains": map[string]any{"kubeletPlugin": map[string]any{"imex": map[string]any{"idleStop": "2s"}}}}})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = c.Stop() }()
	var nodes []string
	for _, n := range fleet.Nodes {
		nodes = append(nodes, n.Name)
	}

	var sum domainResult
	for i := 0; b.Loop(); i++ {
		r := runDomain(ctx, b, c, fmt.Sprintf("cd-bench-%d", i), nodes)
		b.Logf("run %d: %d pods Running after %v, domain Ready after %v; bound to Running p50 %v max %v; per node joining: %.2f clique writes, %.2f index writes",
			i, len(nodes), r.allRunning.Round(time.Millisecond), r.ready.Round(time.Millisecond), r.waitP50.Round(time.Millisecond), r.waitMax.Round(time.Millisecond),
			r.cliqueWrites, r.indexWrites)
		sum.allRunning += r.allRunning
		sum.ready += r.ready
		sum.waitP50 += r.waitP50
		sum.waitMax += r.waitMax
		sum.cliqueWrites += r.cliqueWrites
		sum.indexWrites += r.indexWrites
	}
	runs := float64(b.N)
	b.ReportMetric(sum.allRunning.Seconds()/runs, "s-to-all-Running")
	b.ReportMetric(sum.ready.Seconds()/runs, "s-to-Ready")
	b.ReportMetric(sum.waitP50.Seconds()/runs, "s-bound-to-Running-p50")
	b.ReportMetric(sum.waitMax.Seconds()/runs, "s-bound-to-Running-max")
	b.ReportMetric(sum.cliqueWrites/runs, "clique-writes/node")
	b.ReportMetric(sum.indexWrites/runs, "index-writes/node")
}

// domainResult is what one run measured.
type domainResult struct {
	allRunning, ready, waitP50, waitMax time.Duration
	cliqueWrites, indexWrites           float64
}

// runDomain creates the domain and its pods in namespace ns, measures,
// then deletes them and waits until every daemon had time to stop.
func runDomain(ctx context.Context, b *testing.B, c *cluster.Cluster, ns string, nodes []string) domainResult {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	watch := newPodTimes()
	factory := informers.NewSharedInformerFactoryWithOptions(c.Client(), 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().Pods().Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { watch.see(obj) },
		UpdateFunc: func(_, obj any) { watch.see(obj) },
	})
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)

	before := c.ControlPlane().RequestCounts()
	start := time.Now()
	text := fmt.Sprintf(domainYAML, ns, len(nodes))
	for i, n := range nodes {
		text += "---\n" + fmt.Sprintf(podYAML, ns, fmt.Sprintf("worker-%02d", i), n)
	}
	objs, err := manifests.Parse([]byte(text), "bench")
	if err != nil {
		b.Fatal(err)
	}
	if refused, err := c.Apply(ctx, objs); err != nil || len(refused) != 0 {
		b.Fatalf("apply: %v %v", err, refused)
	}
	var r domainResult
	dyn := c.Dynamic()
	err = clustertest.Poll(ctx, 0, func() bool {
		if r.ready == 0 {
			if obj, err := dyn.Resource(computedomain.GVR).Namespace(ns).Get(ctx, "bench", metav1.GetOptions{}); err == nil {
				if cd, err := computedomain.FromUnstructured(obj); err == nil && cd.Status.Status == v1beta1.ComputeDomainStatusReady {
					r.ready = time.Since(start)
				}
			}
		}
		if r.allRunning == 0 && watch.running() == len(nodes) {
			r.allRunning = watch.lastRunning().Sub(start)
		}
		return r.ready != 0 && r.allRunning != 0
	})
	if err != nil {
		b.Fatalf("namespace %s: domain Ready after %v, %d of %d pods Running: %v", ns, r.ready, watch.running(), len(nodes), err)
	}
	r.waitP50, r.waitMax = watch.waits()
	r.cliqueWrites, r.indexWrites = nodeWrites(c.ControlPlane().RequestCounts().Sub(before), len(nodes))

	// Clean up outside the figures: pods first (their claims release the
	// daemons), then the domain (its finalizer removes what it made).
	for i := range nodes {
		_ = c.Client().CoreV1().Pods(ns).Delete(ctx, fmt.Sprintf("worker-%02d", i), metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}
	_ = dyn.Resource(computedomain.GVR).Namespace(ns).Delete(ctx, "bench", metav1.DeleteOptions{})
	err = clustertest.Poll(ctx, 0, func() bool {
		pods, err := c.Client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil || len(pods.Items) != 0 {
			return false
		}
		_, err = dyn.Resource(computedomain.GVR).Namespace(ns).Get(ctx, "bench", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	if err != nil {
		b.Fatalf("namespace %s: cleanup: %v", ns, err)
	}
	time.Sleep(5 * time.Second) // the daemons' idle stop (2 s) and more
	return r
}

// nodeWrites returns the ComputeDomainClique writes and the index
// registry (ConfigMap) writes per node joining in counts. ConfigMap writes
// by the control plane's controllers (the namespace's root CA) are left
// out.
func nodeWrites(counts controlplane.RequestCounts, nodes int) (clique, index float64) {
	for k, v := range counts {
		if k.Verb != "create" && k.Verb != "update" && k.Verb != "patch" {
			continue
		}
		switch {
		case k.Resource == "computedomaincliques":
			clique += float64(v)
		case k.Resource == "configmaps" && k.Component != "localcluster-controller-manager":
			index += float64(v)
		}
	}
	return clique / float64(nodes), index / float64(nodes)
}

// podTimes records when each pod was first seen bound and Running.
type podTimes struct {
	mu      sync.Mutex
	bound   map[string]time.Time
	started map[string]time.Time
}

func newPodTimes() *podTimes {
	return &podTimes{bound: map[string]time.Time{}, started: map[string]time.Time{}}
}

func (p *podTimes) see(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.bound[pod.Name]; !ok && pod.Spec.NodeName != "" {
		p.bound[pod.Name] = now
	}
	if _, ok := p.started[pod.Name]; !ok && pod.Status.Phase == corev1.PodRunning {
		p.started[pod.Name] = now
	}
}

func (p *podTimes) running() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.started)
}

func (p *podTimes) lastRunning() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var last time.Time
	for _, t := range p.started {
		if t.After(last) {
			last = t
		}
	}
	return last
}

// waits returns the median and the longest wait from bound to Running.
func (p *podTimes) waits() (p50, maxWait time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ws []time.Duration
	for name, t := range p.started {
		if b, ok := p.bound[name]; ok {
			ws = append(ws, t.Sub(b))
		}
	}
	if len(ws) == 0 {
		return 0, 0
	}
	slices.Sort(ws)
	return ws[(len(ws)-1)/2], ws[len(ws)-1]
}
