package loadrun

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/controlplane"
)

// Client limits of the load run's pod creator.
const (
	creatorQPS   = 2000
	creatorBurst = 4000
	creators     = 32
)

// checkBaselineName refuses a --baseline-driver that is no driver
// name or is gpudra's.
func checkBaselineName(name string) error {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("--baseline-driver %q: must be a DNS subdomain (a DRA driver name): %s", name, strings.Join(errs, "; "))
	}
	if name == cluster.DefaultDriverName {
		return fmt.Errorf("--baseline-driver %q: must differ from gpudra's driver name", name)
	}
	return nil
}

// percentile returns the p-th percentile of ds, rounded to milliseconds.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	i := (len(sorted)*p + 99) / 100
	i = min(max(i-1, 0), len(sorted)-1)
	return sorted[i].Round(time.Millisecond)
}

// printRequests prints the API requests per pod of both rounds, by
// component, verb and resource.
func printRequests(w io.Writer, n int, withClaims, without controlplane.RequestCounts) {
	// withClaims are gpudra's round's, without the baseline driver's.
	keys := map[controlplane.RequestKey]bool{}
	for k := range withClaims {
		keys[k] = true
	}
	for k := range without {
		keys[k] = true
	}
	sorted := slices.SortedFunc(maps.Keys(keys), func(a, b controlplane.RequestKey) int {
		return cmp.Or(cmp.Compare(a.Component, b.Component), cmp.Compare(a.Resource, b.Resource), cmp.Compare(a.Verb, b.Verb))
	})
	fmt.Fprintf(w, "  API requests per pod (from the first create until the last pod ran):\n")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "    component\tverb\tresource\tgpudra\tbaseline\t")
	var totalWith, totalWithout int
	for _, k := range sorted {
		totalWith += withClaims[k]
		totalWithout += without[k]
		fmt.Fprintf(tw, "    %s\t%s\t%s\t%.2f\t%.2f\t\n", k.Component, k.Verb, k.Resource, float64(withClaims[k])/float64(n), float64(without[k])/float64(n))
	}
	fmt.Fprintf(tw, "    all\t\t\t%.2f\t%.2f\t\n", float64(totalWith)/float64(n), float64(totalWithout)/float64(n))
	_ = tw.Flush()
}

// Round is what one round of the load run measured.
type Round struct {
	// Makespan is from the first create to the last pod Running.
	Makespan time.Duration
	// Created is from the first create to the last create's answer.
	Created time.Duration
	// Claimed, Bound and Running are, per pod, the time from its create
	// to the first sight of it with its claims made (with claims only),
	// bound to a node, and Running.
	Claimed, Bound, Running []time.Duration
	// Requests are the API requests made from the first create until
	// the last pod ran.
	Requests controlplane.RequestCounts
	// CPU is the CPU time (user and system) this process used in the
	// same period: on a shared machine it says more about the work done
	// than the makespan.
	CPU time.Duration
	// ByDriver is the CPU the round's profile attributes to each DRA
	// driver's goroutines (simnode.DriverLabel).
	ByDriver map[string]time.Duration
}

// loadRound creates a pod of each of kinds at once, with a claim from the
// template templates give for its kind (none with nil templates), and
// returns the time from the first create to the last pod Running (Running
// means prepared: the pod loop marks a pod Running only after the DRA
// manager prepared its claims).
func (lr *runner) loadRound(ctx context.Context, c *cluster.Cluster, client kubernetes.Interface, prefix string, kinds []podKind, templates map[podKind]string, timeout time.Duration) (*Round, error) {
	n := len(kinds)
	claims := templates != nil
	// An informer rather than a bare watch: it survives the watch being
	// closed under load.
	var mu sync.Mutex
	createdAt := make([]time.Time, n)
	claimedAt := map[string]time.Time{}
	boundAt := map[string]time.Time{}
	runningAt := map[string]time.Time{}
	var last time.Time
	allRunning := make(chan struct{})
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace("default"))
	informer := factory.Core().V1().Pods().Informer()
	observe := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || !strings.HasPrefix(pod.Name, prefix+"-") {
			return
		}
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if _, seen := claimedAt[pod.Name]; !seen && len(pod.Status.ResourceClaimStatuses) > 0 {
			claimedAt[pod.Name] = now
		}
		if _, seen := boundAt[pod.Name]; !seen && pod.Spec.NodeName != "" {
			boundAt[pod.Name] = now
		}
		if _, seen := runningAt[pod.Name]; !seen && pod.Status.Phase == corev1.PodRunning {
			runningAt[pod.Name] = now
			last = now
			if len(runningAt) == n {
				close(allRunning)
			}
		}
	}
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: observe, UpdateFunc: func(_, obj any) { observe(obj) }})
	stop := make(chan struct{})
	defer func() { close(stop); factory.Shutdown() }()
	factory.Start(stop)
	factory.WaitForCacheSync(stop)

	lr.progress("creating %d pods (%s)", n, prefix)
	before := c.ControlPlane().RequestCounts()
	cpuBefore := processCPU()
	start := time.Now()
	var lastCreated atomic.Int64
	errs, waitCreated := inParallel(n, func(i int) error {
		t := time.Now()
		if _, err := client.CoreV1().Pods("default").Create(ctx, loadPod(loadPodName(prefix, i), templates[kinds[i]], kinds[i]), metav1.CreateOptions{}); err != nil {
			return err
		}
		mu.Lock()
		createdAt[i] = t
		mu.Unlock()
		for took := int64(time.Since(start)); ; {
			prev := lastCreated.Load()
			if took <= prev || lastCreated.CompareAndSwap(prev, took) {
				return nil
			}
		}
	})
	defer waitCreated()
	select {
	case err := <-errs:
		return nil, fmt.Errorf("create pod: %w", err)
	case <-allRunning:
	case <-time.After(timeout):
		mu.Lock()
		defer mu.Unlock()
		return nil, fmt.Errorf("only %d of %d pods running after %v (--round-timeout)", len(runningAt), n, timeout)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	requests := c.ControlPlane().RequestCounts().Sub(before)
	cpu := processCPU() - cpuBefore
	waitCreated()
	mu.Lock()
	defer mu.Unlock()
	r := &Round{Makespan: last.Sub(start), Created: time.Duration(lastCreated.Load()), Requests: requests, CPU: cpu}
	for i := range n {
		// The informer may have missed an intermediate state (a relist
		// joins updates); the next state seen then stands for it.
		name := loadPodName(prefix, i)
		running := runningAt[name]
		bound := cmp.Or(boundAt[name], running)
		if claims {
			r.Claimed = append(r.Claimed, cmp.Or(claimedAt[name], bound).Sub(createdAt[i]))
		}
		r.Bound = append(r.Bound, bound.Sub(createdAt[i]))
		r.Running = append(r.Running, running.Sub(createdAt[i]))
	}
	lr.progress("%d pods running %v after the first create", n, r.Makespan.Round(time.Millisecond))
	return r, nil
}

func loadPodName(prefix string, i int) string { return fmt.Sprintf("%s-%05d", prefix, i) }

// loadPod is a pod of the given kind (loadKindLabel) with one claim from
// the template, none if template is "".
func loadPod(name, template string, kind podKind) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{loadKindLabel: string(kind)}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "ctr", Image: "ubuntu:24.04",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}},
		}}},
	}
	if template != "" {
		pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptrTo(template)}}
	}
	return pod
}

func ptrTo[T any](v T) *T { return &v }

// deleteAllPods deletes the default namespace's pods and waits until they
// are gone (the nodes unprepare and remove them) and their claims too. The
// pods are deleted one by one by creators goroutines, as they were
// created: one DeleteCollection of 2,000 pods on 1,000 nodes ran past the
// API server's 60 s request timeout on this machine and failed the run.
func deleteAllPods(ctx context.Context, client kubernetes.Interface, timeout time.Duration) error {
	list, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list the pods to delete: %w", err)
	}
	errs, waitDeleted := inParallel(len(list.Items), func(i int) error {
		name := list.Items[i].Name
		if err := client.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete pod %s: %w", name, err)
		}
		return nil
	})
	waitDeleted()
	select {
	case err := <-errs:
		return err
	default:
	}
	return wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{FieldSelector: fields.Everything().String()})
		if err != nil {
			return false, nil
		}
		claims, err := client.ResourceV1().ResourceClaims("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		return len(pods.Items) == 0 && len(claims.Items) == 0, nil
	})
}

// inParallel calls f(i) for each i in [0, n) from creators
// goroutines. A goroutine whose call fails sends the error on errs
// (buffered: it never blocks) and stops; wait waits for all of them.
func inParallel(n int, f func(i int) error) (errs <-chan error, wait func()) {
	var next atomic.Int64
	var wg sync.WaitGroup
	ch := make(chan error, creators)
	for range creators {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				if err := f(int(i)); err != nil {
					ch <- err
					return
				}
			}
		})
	}
	return ch, wg.Wait
}

// processCPU returns the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// peakRSS reads the process's peak resident set size.
func peakRSS() string {
	kb, err := procStatusKB("VmHWM:")
	if err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%d kB", kb)
}
