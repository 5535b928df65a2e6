package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
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

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/controlplane"
)

// Client limits of the load run's pod creator.
const (
	loadCreatorQPS   = 2000
	loadCreatorBurst = 4000
	loadCreators     = 32
)

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
// creation to prepared-and-running, against the same number of pods
// without claims through the same pod loop.
func runLoad(ctx context.Context, o options) error {
	fleet, err := loadFleet(o.loadNodes)
	if err != nil {
		return err
	}
	if gpus := 8 * o.loadNodes; o.load > gpus {
		return fmt.Errorf("--load %d is more than the %d GPUs of %d nodes", o.load, gpus, o.loadNodes)
	}
	cpOpts := controlplane.Options{}
	opts := cluster.Options{Fleet: fleet, ControlPlane: cpOpts, Progress: func(msg string) { progress("%s", msg) }}
	progress("starting the local cluster: %d nodes of 8 H100", o.loadNodes)
	start := time.Now()
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return err
	}
	defer func() {
		progress("stopping the local cluster")
		quietStderr(func() { _ = c.Stop() })
	}()
	progress("cluster ready in %v", time.Since(start).Round(time.Millisecond))

	client, err := kubernetes.NewForConfig(c.ControlPlane().RESTConfig("gpudra-sim-load", loadCreatorQPS, loadCreatorBurst))
	if err != nil {
		return err
	}
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "one-gpu"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}}},
		}}},
	}
	if _, err := client.ResourceV1().ResourceClaimTemplates("default").Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		return err
	}

	// Plain pods first: deleting them leaves nothing behind for the
	// nodes and controllers to clean up while the claims round runs.
	without, err := loadRound(ctx, client, "plain", o.load, false)
	if err != nil {
		return err
	}
	progress("deleting the pods")
	if err := deleteAllPods(ctx, client); err != nil {
		return err
	}
	stopProfile := func() {}
	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		stopProfile = func() { pprof.StopCPUProfile(); f.Close() }
	}
	withClaims, err := loadRound(ctx, client, "claims", o.load, true)
	stopProfile()
	if err != nil {
		return err
	}
	cp := c.ControlPlane().Options()
	fmt.Printf(`
load run: %d pods on %d simulated nodes (8 H100 each), one-GPU claim templates vs no claims
  with claims:    makespan %v  (%.1f pods/s)
  without claims: makespan %v  (%.1f pods/s)
  ratio with/without: %.2f
  client QPS/burst: scheduler %g/%d, controllers %g/%d, each node's kubelet parts and plugin 100/200 each, pod creator %d/%d (%d goroutines)
  peak RSS of this process: %s; GOMAXPROCS %d
`, o.load, o.loadNodes,
		withClaims.Round(time.Millisecond), float64(o.load)/withClaims.Seconds(),
		without.Round(time.Millisecond), float64(o.load)/without.Seconds(),
		withClaims.Seconds()/without.Seconds(),
		cp.SchedulerQPS, cp.SchedulerBurst, cp.ControllerQPS, cp.ControllerBurst,
		loadCreatorQPS, loadCreatorBurst, loadCreators,
		peakRSS(), runtime.GOMAXPROCS(0))
	return nil
}

// loadRound creates n pods at once and returns the time from the first
// create to the last pod Running (Running means prepared: the pod loop
// marks a pod Running only after the DRA manager prepared its claims).
func loadRound(ctx context.Context, client kubernetes.Interface, prefix string, n int, claims bool) (time.Duration, error) {
	// An informer rather than a bare watch: it survives the watch being
	// closed under load.
	var mu sync.Mutex
	running := map[string]bool{}
	var last time.Time
	allRunning := make(chan struct{})
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace("default"))
	informer := factory.Core().V1().Pods().Informer()
	observe := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || pod.Status.Phase != corev1.PodRunning || !strings.HasPrefix(pod.Name, prefix+"-") {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !running[pod.Name] {
			running[pod.Name] = true
			last = time.Now()
			if len(running) == n {
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
	start := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, loadCreators)
	for range loadCreators {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				if _, err := client.CoreV1().Pods("default").Create(ctx, loadPod(fmt.Sprintf("%s-%05d", prefix, i), claims), metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	defer wg.Wait()
	select {
	case err := <-errs:
		return 0, fmt.Errorf("create pod: %w", err)
	case <-allRunning:
	case <-time.After(10 * time.Minute):
		mu.Lock()
		defer mu.Unlock()
		return 0, fmt.Errorf("only %d of %d pods running after 10 minutes", len(running), n)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	mu.Lock()
	makespan := last.Sub(start)
	mu.Unlock()
	progress("%d pods running %v after the first create", n, makespan.Round(time.Millisecond))
	return makespan, nil
}

func loadPod(name string, claims bool) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "ctr", Image: "ubuntu:24.04",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}},
		}}},
	}
	if claims {
		pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
		pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptrTo("one-gpu")}}
	}
	return pod
}

func ptrTo[T any](v T) *T { return &v }

// deleteAllPods deletes the default namespace's pods and waits until they
// are gone (the nodes unprepare and remove them) and their claims too.
func deleteAllPods(ctx context.Context, client kubernetes.Interface) error {
	if err := client.CoreV1().Pods("default").DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
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

// peakRSS reads the process's peak resident set size.
func peakRSS() string {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}
