package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/gpudra/gpudra/pkg/hardware/sim"

	"github.com/gpudra/gpudra/localcluster/baseline"
	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/controlplane"
)

// Client limits of the load run's pod creator.
const (
	loadCreatorQPS   = 2000
	loadCreatorBurst = 4000
	loadCreators     = 32
)

// defaultLoadDir is where the load run keeps the cluster's state: in
// memory (/dev/shm) where there is one. A hundred simulated nodes write
// their DRA manager checkpoints, gpudra's checkpoints and CDI specs, with
// fsync, to what on a real cluster are a hundred disks; on one shared
// disk the file creation and syncing of the claims round cost more CPU
// and time than the nodes' own work, which is not what the run measures.
// The files are still written and read back as on a real node.
func defaultLoadDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if f, err := os.CreateTemp("/dev/shm", "gpudra-sim-probe-"); err == nil {
			f.Close()
			os.Remove(f.Name())
			return "/dev/shm"
		}
	}
	return os.TempDir()
}

// loadFleet describes n nodes of eight H100s each.
func loadFleet(n int) (*sim.Fleet, error) {
	var b strings.Builder
	b.WriteString("nodes:\n")
	for i := range n {
		fmt.Fprintf(&b, "- name: node-%03d\n  gpus:\n", i)
		for range 8 {
			b.WriteString("  - model: H100-SXM5-80GB\n")
		}
	}
	return sim.Parse([]byte(b.String()), "load fleet")
}

// runLoad measures how fast pods with one-GPU claim templates go from
// creation to prepared-and-running with gpudra, against the same pods and
// claims served by the baseline driver (package baseline) on the same
// nodes, in alternating rounds (compare.go).
func runLoad(ctx context.Context, o options) error {
	fleet, err := loadFleet(o.loadNodes)
	if err != nil {
		return err
	}
	if o.loadRoundTimeout <= 0 {
		return fmt.Errorf("--load-round-timeout %v: must be positive", o.loadRoundTimeout)
	}
	if gpus := 8 * o.loadNodes; o.load > gpus {
		return fmt.Errorf("--load %d is more than the %d GPUs of %d nodes", o.load, gpus, o.loadNodes)
	}
	base := o.loadDir
	if base == "" {
		base = defaultLoadDir()
	}
	dir, err := os.MkdirTemp(base, "gpudra-sim-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cpOpts := controlplane.Options{}
	opts := cluster.Options{Fleet: fleet, Dir: dir, ControlPlane: cpOpts, Baseline: baselineDriver, Progress: func(msg string) { progress("%s", msg) }}
	progress("starting the local cluster: %d nodes of 8 H100, state in %s", o.loadNodes, dir)
	start := time.Now()
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		progress("stopping the local cluster")
		quietStderr(func() { _ = c.Stop() })
	}()
	started := time.Since(start)
	progress("cluster ready in %v", started.Round(time.Millisecond))

	client, err := kubernetes.NewForConfig(c.ControlPlane().RESTConfig("gpudra-sim-load", loadCreatorQPS, loadCreatorBurst))
	if err != nil {
		return err
	}
	cost, err := measureFleet(ctx, c.ControlPlane(), client, o.loadNodes, started)
	if err != nil {
		return fmt.Errorf("measure the idle fleet: %w", err)
	}
	cost.print(os.Stdout)
	return compareDrivers(ctx, o, c, client, base)
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

// verifyLoad checks the outcome of a round: every pod Running on a node;
// with claims of driver, each pod's claim allocated exactly one device of
// its own node, no device given to two pods, and the node's DRA manager
// prepared that device for the container, whose CDI device resolved to a
// device node (gpudra) or to the baseline driver's environment variable.
// Without claims (driver ""), no pod got a device.
func verifyLoad(ctx context.Context, c *cluster.Cluster, client kubernetes.Interface, prefix string, n int, driver string) error {
	pods, err := client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	claimList, err := client.ResourceV1().ResourceClaims("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	claimsByName := map[string]*resourceapi.ResourceClaim{}
	for i := range claimList.Items {
		claimsByName[claimList.Items[i].Name] = &claimList.Items[i]
	}
	owner := map[string]string{} // pool/device -> pod
	checked := 0
	var errs []error
	for i := range pods.Items {
		pod := &pods.Items[i]
		if !strings.HasPrefix(pod.Name, prefix+"-") {
			continue
		}
		checked++
		if err := verifyPod(c, pod, driver, claimsByName, owner); err != nil {
			errs = append(errs, fmt.Errorf("pod %s: %w", pod.Name, err))
		}
	}
	if checked != n {
		errs = append(errs, fmt.Errorf("%d %s pods, want %d", checked, prefix, n))
	}
	if len(errs) > 0 {
		return fmt.Errorf("load round %s: %d problems, the first: %w", prefix, len(errs), errs[0])
	}
	return nil
}

func verifyPod(c *cluster.Cluster, pod *corev1.Pod, driver string, claimsByName map[string]*resourceapi.ResourceClaim, owner map[string]string) error {
	if pod.Status.Phase != corev1.PodRunning {
		return fmt.Errorf("phase %s", pod.Status.Phase)
	}
	node := c.Node(pod.Spec.NodeName)
	if node == nil {
		return fmt.Errorf("on unknown node %q", pod.Spec.NodeName)
	}
	ctrs, ok := node.Containers(pod)
	if !ok {
		return fmt.Errorf("node %s has no record of starting it", node.Name())
	}
	devs := ctrs["ctr"]
	if driver == "" {
		if len(devs.CDIDevices) != 0 || len(devs.Claims) != 0 {
			return fmt.Errorf("got devices %v without a claim", devs.CDIDevices)
		}
		return nil
	}
	names := cluster.ClaimNames(pod)
	if len(names) != 1 {
		return fmt.Errorf("claims %v, want one", names)
	}
	claim := claimsByName[names[0]]
	if claim == nil || claim.Status.Allocation == nil {
		return fmt.Errorf("claim %s missing or not allocated", names[0])
	}
	results := claim.Status.Allocation.Devices.Results
	if len(results) != 1 {
		return fmt.Errorf("claim %s has %d devices, want 1", claim.Name, len(results))
	}
	res := results[0]
	if res.Driver != driver || res.Pool != node.Name() {
		return fmt.Errorf("claim %s: device %s/%s/%s, want one of node %s", claim.Name, res.Driver, res.Pool, res.Device, node.Name())
	}
	key := res.Pool + "/" + res.Device
	if other, taken := owner[key]; taken {
		return fmt.Errorf("device %s also given to pod %s", key, other)
	}
	owner[key] = pod.Name
	if len(devs.Claims) != 1 || len(devs.Claims[0].Devices) != 1 {
		return fmt.Errorf("node prepared %+v, want one claim with one device", devs.Claims)
	}
	if p := devs.Claims[0].Devices[0]; p.Pool != res.Pool || p.Device != res.Device {
		return fmt.Errorf("node prepared %s/%s, claim allocated %s", p.Pool, p.Device, key)
	}
	if driver == baselineDriver {
		if got := devs.Env[baseline.DeviceEnv]; len(devs.CDIDevices) == 0 || got != res.Device {
			return fmt.Errorf("CDI devices %v resolved to %s=%q, want %q", devs.CDIDevices, baseline.DeviceEnv, got, res.Device)
		}
		return nil
	}
	if len(devs.CDIDevices) == 0 || len(devs.DeviceNodes) == 0 {
		return fmt.Errorf("CDI devices %v resolved to device nodes %v", devs.CDIDevices, devs.DeviceNodes)
	}
	return nil
}

// roundResult is what one round of the load run measured.
type roundResult struct {
	// makespan is from the first create to the last pod Running.
	makespan time.Duration
	// created is from the first create to the last create's answer.
	created time.Duration
	// claimed, bound and running are, per pod, the time from its create
	// to the first sight of it with its claims made (with claims only),
	// bound to a node, and Running.
	claimed, bound, running []time.Duration
	// requests are the API requests made from the first create until
	// the last pod ran.
	requests controlplane.RequestCounts
	// cpu is the CPU time (user and system) this process used in the
	// same period: on a shared machine it says more about the work done
	// than the makespan.
	cpu time.Duration
	// byDriver is the CPU the round's profile attributes to each DRA
	// driver's goroutines (simnode.DriverLabel).
	byDriver map[string]time.Duration
}

// loadRound creates n pods at once and returns the time from the first
// create to the last pod Running (Running means prepared: the pod loop
// marks a pod Running only after the DRA manager prepared its claims).
func loadRound(ctx context.Context, c *cluster.Cluster, client kubernetes.Interface, prefix string, n int, template string, timeout time.Duration) (*roundResult, error) {
	claims := template != ""
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

	progress("creating %d pods (%s)", n, prefix)
	before := c.ControlPlane().RequestCounts()
	cpuBefore := processCPU()
	start := time.Now()
	var next atomic.Int64
	var lastCreated atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, loadCreators)
	for range loadCreators {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				t := time.Now()
				if _, err := client.CoreV1().Pods("default").Create(ctx, loadPod(loadPodName(prefix, int(i)), template), metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				createdAt[i] = t
				mu.Unlock()
				for took := int64(time.Since(start)); ; {
					prev := lastCreated.Load()
					if took <= prev || lastCreated.CompareAndSwap(prev, took) {
						break
					}
				}
			}
		})
	}
	defer wg.Wait()
	select {
	case err := <-errs:
		return nil, fmt.Errorf("create pod: %w", err)
	case <-allRunning:
	case <-time.After(timeout):
		mu.Lock()
		defer mu.Unlock()
		return nil, fmt.Errorf("only %d of %d pods running after %v (--load-round-timeout)", len(runningAt), n, timeout)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	requests := c.ControlPlane().RequestCounts().Sub(before)
	cpu := processCPU() - cpuBefore
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	r := &roundResult{makespan: last.Sub(start), created: time.Duration(lastCreated.Load()), requests: requests, cpu: cpu}
	for i := range n {
		// The informer may have missed an intermediate state (a relist
		// joins updates); the next state seen then stands for it.
		name := loadPodName(prefix, i)
		running := runningAt[name]
		bound := cmp.Or(boundAt[name], running)
		if claims {
			r.claimed = append(r.claimed, cmp.Or(claimedAt[name], bound).Sub(createdAt[i]))
		}
		r.bound = append(r.bound, bound.Sub(createdAt[i]))
		r.running = append(r.running, running.Sub(createdAt[i]))
	}
	progress("%d pods running %v after the first create", n, r.makespan.Round(time.Millisecond))
	return r, nil
}

func loadPodName(prefix string, i int) string { return fmt.Sprintf("%s-%05d", prefix, i) }

// loadPod is a pod with one claim from the template, none if template is
// "".
func loadPod(name, template string) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
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
// are gone (the nodes unprepare and remove them) and their claims too.
func deleteAllPods(ctx context.Context, client kubernetes.Interface, timeout time.Duration) error {
	if err := client.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
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
