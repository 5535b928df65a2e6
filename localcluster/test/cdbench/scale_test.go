package cdbench

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/deployments/crds"
	"github.com/gpudra/gpudra/pkg/computedomain"

	"github.com/gpudra/gpudra/localcluster/controlplane"
	cdcontroller "github.com/gpudra/gpudra/pkg/computedomain/controller"
	cdnode "github.com/gpudra/gpudra/pkg/computedomain/node"
)

var (
	scaleNodes   = flag.Int("cdbench.nodes", 40, "BenchmarkComputeDomainScale: simulated nodes")
	scaleDomains = flag.Int("cdbench.domains", 2, "BenchmarkComputeDomainScale: ComputeDomains, each on a clique of its own")
	scaleLimit   = flag.Duration("cdbench.limit", 5*time.Minute, "BenchmarkComputeDomainScale: how long to wait for every domain to be Ready before reporting how many are")
)

// Client limits: a node's reporter has client-go's defaults, like a
// node's plugin; the benchmark's own client (creating domains, polling
// them) and the controller's are not what is measured.
const (
	nodeQPS, nodeBurst   = rest.DefaultQPS, rest.DefaultBurst
	adminQPS, adminBurst = 500, 1000
	scaleNamespace       = "cd-scale"
)

// BenchmarkComputeDomainScale: -cdbench.nodes simulated nodes in
// -cdbench.domains ComputeDomains (domain d on clique d, numNodes its
// node count), against a real kube-apiserver in process, the controller,
// and one node.Reporter per node with its own client at client-go's
// default 5 QPS; every node's daemon is ready from the start, and every
// node joins its domain as soon as the domain exists (as the first
// channel claim's Prepare on it would). Reported: time from creation to
// every domain Ready, the domains Ready then, and per node joining the
// requests, successful writes, index registry update attempts and
// conflicts its client made up to then; the process's peak RSS (API
// server and etcd included).
func BenchmarkComputeDomainScale(b *testing.B) {
	nodes, domains := *scaleNodes, *scaleDomains
	if nodes < domains || domains < 1 {
		b.Fatalf("-cdbench.nodes %d, -cdbench.domains %d: want at least one node per domain", nodes, domains)
	}
	var sum scaleResult
	for i := 0; b.Loop(); i++ {
		r := runScale(b, nodes, domains, *scaleLimit)
		slices.Sort(r.joins)
		b.Logf("run %d: Join returned p50 %v, max %v (last at %v); %d Joins failed (the reporters retried; the first: %v)", i,
			r.joins[len(r.joins)/2].Round(time.Millisecond), r.joins[len(r.joins)-1].Round(time.Millisecond), r.joined.Round(time.Millisecond), r.joinFailed, r.firstJoinErr)
		b.Logf("run %d: %d nodes, %d domains: %d Ready after %v; per node: %.1f requests, %.2f writes, %.2f index updates, %.2f conflicts",
			i, nodes, domains, r.ready, r.took.Round(time.Millisecond), r.perNode(r.tally.requests.Load()), r.perNode(r.tally.writes.Load()),
			r.perNode(r.tally.updates.Load()), r.perNode(r.tally.conflicts.Load()))
		sum.took += r.took
		sum.ready += r.ready
		sum.nodes += r.nodes
		sum.tally.add(&r.tally)
	}
	runs := float64(b.N)
	b.ReportMetric(sum.took.Seconds()/runs, "s-to-all-Ready")
	b.ReportMetric(float64(sum.ready)/runs, "domains-Ready")
	b.ReportMetric(sum.perNode(sum.tally.requests.Load()), "requests/node")
	b.ReportMetric(sum.perNode(sum.tally.writes.Load()), "writes/node")
	b.ReportMetric(sum.perNode(sum.tally.updates.Load()), "updates/node")
	b.ReportMetric(sum.perNode(sum.tally.conflicts.Load()), "conflicts/node")
	b.ReportMetric(float64(peakRSS())/(1<<20), "peak-RSS-MiB")
}

// scaleResult is what one run measured.
type scaleResult struct {
	took  time.Duration
	ready int
	nodes int
	tally requestTally
	// joins is when each node's Join returned (its index taken and its
	// entry applied, or failed), from creation; joined when the last did.
	joins      []time.Duration
	joined     time.Duration
	joinFailed int
	// firstJoinErr is the first failed Join's error.
	firstJoinErr error
}

func (r *scaleResult) perNode(n int64) float64 { return float64(n) / float64(r.nodes) }

// runScale starts a control plane and runs one measurement on it.
func runScale(b *testing.B, nodes, domains int, limit time.Duration) *scaleResult {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = cp.Stop() }()
	admin := cp.RESTConfig("cdbench", adminQPS, adminBurst)
	client := kubernetes.NewForConfigOrDie(admin)
	dyn := dynamic.NewForConfigOrDie(admin)
	if err := installCRDs(ctx, dyn); err != nil {
		b.Fatal(err)
	}
	for _, ns := range []string{scaleNamespace, "gpudra"} {
		if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	ctrlCfg := cp.RESTConfig("compute-domain-controller", adminQPS, adminBurst)
	ctrl := cdcontroller.New(cdcontroller.Config{
		KubeClient: kubernetes.NewForConfigOrDie(ctrlCfg), DynamicClient: dynamic.NewForConfigOrDie(ctrlCfg),
		CliqueNamespace: "gpudra", MaxChannels: 2048,
	})
	ctrlDone := make(chan error, 1)
	go func() { ctrlDone <- ctrl.Run(ctx) }()
	defer func() { cancel(); <-ctrlDone }() //nolint:errcheck // the controller stops with the context

	// The reporters start (and watch nothing yet) before the clock does.
	tallies := make([]*requestTally, nodes)
	reporters := make([]*cdnode.Reporter, nodes)
	maxPerDomain := (nodes + domains - 1) / domains
	for i := range nodes {
		tallies[i] = &requestTally{}
		cfg := cp.RESTConfig("gpudra-node-"+strconv.Itoa(i), nodeQPS, nodeBurst)
		tally := tallies[i]
		cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return &countingTransport{next: rt, tally: tally} })
		reporters[i] = cdnode.NewReporter(cdnode.ReporterConfig{
			Dynamic:   dynamic.NewForConfigOrDie(cfg),
			Indices:   &cdnode.IndexRegistry{Client: kubernetes.NewForConfigOrDie(cfg), Namespace: "gpudra", MaxNodes: max(maxPerDomain, 18)},
			Namespace: "gpudra", NodeName: fmt.Sprintf("node-%04d", i), NodeIP: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255),
		})
		reporters[i].SetReady(true)
		go reporters[i].Run(ctx)
	}

	start := time.Now()
	uids := make([]string, domains)
	for d := range domains {
		first, last := d*nodes/domains, (d+1)*nodes/domains
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1beta1.GroupName + "/" + v1beta1.Version, "kind": "ComputeDomain",
			"metadata": map[string]any{"name": fmt.Sprintf("domain-%02d", d), "namespace": scaleNamespace},
			"spec": map[string]any{"numNodes": int64(last - first),
				"channel": map[string]any{"resourceClaimTemplate": map[string]any{"name": fmt.Sprintf("domain-%02d-channel", d)}}},
		}}
		created, err := dyn.Resource(computedomain.GVR).Namespace(scaleNamespace).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		uids[d] = string(created.GetUID())
	}
	r := &scaleResult{nodes: nodes, joins: make([]time.Duration, nodes)}
	var failed atomic.Int64
	var wg sync.WaitGroup
	for d := range domains {
		for i := d * nodes / domains; i < (d+1)*nodes/domains; i++ {
			wg.Go(func() {
				logger := klog.Background().WithValues("node", i)
				// A failed join stays joined: Run tries again.
				if err := reporters[i].Join(klog.NewContext(ctx, logger), uids[d], fmt.Sprintf("clique-%02d", d)); err != nil {
					if failed.Add(1) == 1 {
						r.firstJoinErr = err
					}
					logger.V(2).Info("Join failed; the reporter retries", "err", err)
				}
				r.joins[i] = time.Since(start)
			})
		}
	}
	wg.Wait()
	r.joinFailed = int(failed.Load())
	r.joined = time.Since(start)

	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, limit, true, func(ctx context.Context) (bool, error) {
		list, err := dyn.Resource(computedomain.GVR).Namespace(scaleNamespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		r.ready = 0
		for i := range list.Items {
			if s, _, _ := unstructured.NestedString(list.Items[i].Object, "status", "status"); s == v1beta1.ComputeDomainStatusReady {
				r.ready++
			}
		}
		return r.ready == domains, nil
	})
	r.took = time.Since(start)
	if err != nil {
		b.Logf("%d of %d domains Ready after %v", r.ready, domains, limit)
	}
	for _, t := range tallies {
		r.tally.add(t)
	}
	return r
}

// crdGVR is the CustomResourceDefinition resource.
var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// installCRDs installs the ComputeDomain CRDs and waits until they are
// served.
func installCRDs(ctx context.Context, dyn dynamic.Interface) error {
	for _, name := range []string{"computedomains.resource.nvidia.com", "computedomaincliques.resource.nvidia.com"} {
		data, err := crds.Read(name)
		if err != nil {
			return err
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &obj.Object); err != nil {
			return fmt.Errorf("CRD %s: %w", name, err)
		}
		if _, err := dyn.Resource(crdGVR).Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("install CRD %s: %w", name, err)
		}
	}
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err1 := dyn.Resource(computedomain.GVR).List(ctx, metav1.ListOptions{})
		_, err2 := dyn.Resource(computedomain.CliqueGVR).List(ctx, metav1.ListOptions{})
		return err1 == nil && err2 == nil, nil
	})
}

// peakRSS returns the process's peak resident set size in bytes
// (VmHWM), 0 where /proc does not say.
func peakRSS() int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
