// Package fleetviewbrowser checks gpudra's fleet view page in headless
// Chromium against the local cluster.
package fleetviewbrowser

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/internal/cutproxy"
	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/manifests"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
	"github.com/gpudra/gpudra/pkg/fleetview"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

func TestMain(m *testing.M) {
	// Started as one of the nodes' fake daemons (cluster.Start installs
	// them).
	if code, ok := cluster.Main(); ok {
		os.Exit(code)
	}
	// The control plane's components log through klog; the test's own
	// lines are what matters.
	klog.SetOutput(io.Discard)
	klog.LogToStderr(false)
	os.Exit(m.Run())
}

// chromium finds Debian's chromium; the test skips without it unless
// GPUDRA_REQUIRE_CHROMIUM=1 (CI), where its absence fails.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	if os.Getenv("GPUDRA_REQUIRE_CHROMIUM") == "1" {
		t.Fatal("chromium not found and GPUDRA_REQUIRE_CHROMIUM=1: apt-get install -y chromium")
	}
	t.Skip("chromium not found (apt-get install -y chromium); set GPUDRA_REQUIRE_CHROMIUM=1 to fail instead")
	return ""
}

// browser starts headless Chromium with a fresh profile and nothing that
// phones home.
func browser(t *testing.T, ctx context.Context) context.Context {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(ctx,
		chromedp.ExecPath(chromium(t)),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 900),
	)
	bctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return bctx
}

const workload = `apiVersion: v1
kind: Namespace
metadata:
  name: fv
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  namespace: fv
  name: two-gpus
spec:
  spec:
    devices:
      requests:
      - name: gpus
        exactly:
          deviceClassName: gpu.nvidia.com
          count: 2
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  namespace: fv
  name: one-gpu
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  namespace: fv
  name: mig-1g10gb
spec:
  spec:
    devices:
      requests:
      - name: mig
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel:
              expression: device.attributes['gpu.nvidia.com'].profile == '1g.10gb'
`

func pod(name, template string) string {
	return fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata:
  namespace: fv
  name: %s
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: ctr
    image: ubuntu:24.04
    resources:
      claims:
      - name: dev
  resourceClaims:
  - name: dev
    resourceClaimTemplateName: %s
`, name, template)
}

// TestFleetViewInChromium: on the demo fleet with a few claims the page
// loads, a search for a pod lists exactly its claim's devices, deleting
// the pod drops it from the page, a GPU's XID shows as unhealthy until it
// recovers, and cutting the API server shows the disconnected banner
// until it is back and the page updates again.
func TestFleetViewInChromium(t *testing.T) {
	chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	fleet, err := simfleet.Load("demo")
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.Start(ctx, cluster.Options{Fleet: fleet})
	if err != nil {
		t.Fatalf("start the local cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop the local cluster: %v", err)
		}
	})
	apply(t, ctx, c, workload+pod("trainer", "two-gpus")+pod("notebook", "one-gpu")+pod("small", "mig-1g10gb"))
	for _, name := range []string{"trainer", "notebook", "small"} {
		waitRunning(t, ctx, c.Client(), name)
	}

	// The fleet view reaches the API server through a proxy the test
	// can cut.
	cfg := c.ControlPlane().RESTConfig("fleet-view-test", 50, 100)
	apiURL, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := cutproxy.Start(apiURL.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	cfg.Host = "https://" + proxy.Addr()
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	view := fleetview.New(client, fleetview.Options{})
	go view.Run(ctx)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = fleetview.Serve(ctx, l, view.Handler()) }()
	page := "http://" + l.Addr().String() + "/"

	bctx := browser(t, ctx)
	start := time.Now()
	if err := chromedp.Do(bctx,
		chromedp.Navigate(page),
		chromedp.Poll[chromedp.Void](`window.fleetView.loadedMs !== null && document.querySelectorAll('.node').length === 7 && document.body.innerText.includes('fv/trainer')`, chromedp.WithPollingTimeout(30*time.Second)),
	); err != nil {
		t.Fatalf("page did not load with the demo fleet's 7 DRA nodes and the trainer pod: %v", err)
	}
	loadedMs, err := chromedp.Run(bctx, chromedp.Evaluate[float64](`window.fleetView.loadedMs`))
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll('.node').length`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("page loaded: %d nodes drawn %.0f ms after navigation started (performance.now); %v from the test's Navigate to the pod shown", nodes, loadedMs, time.Since(start).Round(time.Millisecond))
	// A search for the pod lists exactly its claim's devices.
	want := allocatedDevices(t, ctx, c.Client(), "trainer")
	if len(want) != 2 {
		t.Fatalf("trainer holds %v, want 2 GPUs", want)
	}
	if err := chromedp.Do(bctx,
		chromedp.SendKeys(chromedp.CSS("#search"), "fv/trainer"),
		chromedp.Poll[chromedp.Void](`document.querySelectorAll('#results tr.result').length > 0`, chromedp.WithPollingTimeout(10*time.Second)),
	); err != nil {
		t.Fatalf("search: %v", err)
	}
	got, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#results tr.result')].map(r => r.dataset.node + '/' + r.dataset.device)`))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("search for fv/trainer lists %v, want its claim's devices %v", got, want)
	}

	// The screenshot in docs/guides/fleetview/ is this page: the demo fleet with
	// the search for the trainer pod.
	if path := os.Getenv("GPUDRA_FLEETVIEW_SCREENSHOT"); path != "" {
		shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, shot, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot written to %s (%d bytes)", path, len(shot))
	}

	// ?q= opens the page with a search.
	wantNotebook := allocatedDevices(t, ctx, c.Client(), "notebook")
	if err := chromedp.Do(bctx,
		chromedp.Navigate(page+"?q=fv%2Fnotebook"),
		chromedp.Poll[chromedp.Void](`document.querySelectorAll('#results tr.result').length > 0`, chromedp.WithPollingTimeout(10*time.Second)),
	); err != nil {
		t.Fatalf("?q=: %v", err)
	}
	if got, err = chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#results tr.result')].map(r => r.dataset.node + '/' + r.dataset.device)`)); err != nil || !slices.Equal(got, wantNotebook) {
		t.Errorf("?q=fv/notebook lists %v (%v), want %v", got, err, wantNotebook)
	}
	if err := chromedp.Do(bctx,
		chromedp.Navigate(page),
		chromedp.Poll[chromedp.Void](`window.fleetView.loadedMs !== null && document.body.innerText.includes('fv/trainer')`, chromedp.WithPollingTimeout(10*time.Second)),
		chromedp.SendKeys(chromedp.CSS("#search"), "fv/trainer"),
		chromedp.Poll[chromedp.Void](`document.querySelectorAll('#results tr.result').length > 0`, chromedp.WithPollingTimeout(10*time.Second)),
	); err != nil {
		t.Fatalf("search again: %v", err)
	}

	// Deleting the pod drops it from the page (its claim goes with it).
	if err := c.Client().CoreV1().Pods("fv").Delete(ctx, "trainer", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(bctx, chromedp.Poll[chromedp.Void](`document.querySelectorAll('#results tr.result').length === 0 && !document.getElementById('nodes').innerText.includes('fv/trainer')`, chromedp.WithPollingTimeout(60*time.Second))); err != nil {
		t.Fatalf("the deleted pod stays on the page: %v", err)
	}

	// A GPU's XID shows as its health taint, and goes on recovery.
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return c.HealthWatched("dgx-h100-1", 0), nil
	}); err != nil {
		t.Fatalf("the plugin of dgx-h100-1 does not watch GPU 0's health: %v", err)
	}
	for _, step := range []struct{ event, poll string }{
		{"xid:79", `(() => { const g = document.querySelector('#node-dgx-h100-1 .gpu[data-gpu="gpu-0"]'); return g && g.classList.contains('unhealthy') && g.innerText.includes('gpu.nvidia.com/xid=79:NoSchedule') })()`},
		{"recover", `(() => { const g = document.querySelector('#node-dgx-h100-1 .gpu[data-gpu="gpu-0"]'); return g && !g.classList.contains('unhealthy') && !g.innerText.includes('xid') })()`},
	} {
		e, err := sim.ParseHealthEvent(step.event)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.InjectHealth("dgx-h100-1", 0, e); err != nil {
			t.Fatal(err)
		}
		if err := chromedp.Do(bctx, chromedp.Poll[chromedp.Void](step.poll, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			t.Fatalf("after %s on dgx-h100-1 GPU 0, the page does not show it: %v", step.event, err)
		}
	}

	// Cut the API server: the banner says so; back: it goes, and the
	// page follows the cluster again.
	proxy.Cut(cutproxy.Refuse)
	if err := chromedp.Do(bctx, chromedp.Poll[chromedp.Void](`[...document.querySelectorAll('.banner.error')].some(b => b.innerText.includes('Disconnected'))`, chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("no disconnected banner with the API server cut: %v", err)
	}
	banner, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById('banners').innerText`))
	t.Logf("banner with the API server cut: %q", banner)
	proxy.Restore()
	if err := chromedp.Do(bctx, chromedp.Poll[chromedp.Void](`![...document.querySelectorAll('.banner')].some(b => b.innerText.includes('Disconnected'))`, chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("the disconnected banner stays after the API server is back: %v", err)
	}
	apply(t, ctx, c, pod("after", "one-gpu"))
	waitRunning(t, ctx, c.Client(), "after")
	if err := chromedp.Do(bctx,
		chromedp.Poll[chromedp.Void](`(() => { const i = document.getElementById('search'); i.value = 'fv/after'; i.dispatchEvent(new Event('input')); return true })()`),
		chromedp.Poll[chromedp.Void](`document.querySelectorAll('#results tr.result').length === 1`, chromedp.WithPollingTimeout(60*time.Second)),
	); err != nil {
		t.Fatalf("the page does not follow the cluster after the API server came back: %v", err)
	}
}

func apply(t *testing.T, ctx context.Context, c *cluster.Cluster, yamlText string) {
	t.Helper()
	objs, err := manifests.Parse([]byte(yamlText), "test")
	if err != nil {
		t.Fatal(err)
	}
	manifests.Sort(objs)
	refused, err := c.Apply(ctx, objs)
	if err != nil || len(refused) > 0 {
		t.Fatalf("apply: %v %v", err, refused)
	}
}

func waitRunning(t *testing.T, ctx context.Context, client kubernetes.Interface, name string) {
	t.Helper()
	clustertest.Eventually(t, ctx, time.Minute, "pod fv/"+name+" running", func() bool {
		p, err := client.CoreV1().Pods("fv").Get(ctx, name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodRunning
	})
}

// allocatedDevices returns node/device of each device the pod's claims
// were allocated, sorted.
func allocatedDevices(t *testing.T, ctx context.Context, client kubernetes.Interface, name string) []string {
	t.Helper()
	p, err := client.CoreV1().Pods("fv").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName == nil {
			continue
		}
		claim, err := client.ResourceV1().ResourceClaims("fv").Get(ctx, *s.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range claim.Status.Allocation.Devices.Results {
			out = append(out, r.Pool+"/"+r.Device)
		}
	}
	slices.Sort(out)
	return out
}
