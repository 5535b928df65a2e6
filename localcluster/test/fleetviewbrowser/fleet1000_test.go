package fleetviewbrowser

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/localcluster/controlplane"
	"github.com/gpudra/gpudra/pkg/fleetview"
)

const (
	bigNodes       = 1000
	gpusPerNode    = 8
	bigDriver      = "gpu.nvidia.com"
	viewerUser     = "fleet-viewer"
	writeWorkers   = 32
	heldEveryNthGP = 2
)

// TestFleetViewThousandNodesWithoutPods: 1,000 nodes of 8 GPUs (a full
// GPU and a VFIO device each, every other GPU held by a claim) written
// straight into an API server with RBAC, viewed by a user bound to the
// shipped ClusterRole without pods: the page names pods and list, and
// draws the 1,000 nodes with their holders. The load time is logged.
func TestFleetViewThousandNodesWithoutPods(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 1,000 nodes take a while to write")
	}
	chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{AuthorizationModes: []string{"RBAC"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stop the control plane: %v", err)
		}
	})
	admin := kubernetes.NewForConfigOrDie(cp.RESTConfig("fleet-view-test-admin", 2000, 4000))
	bindViewerWithoutPods(t, ctx, admin)
	start := time.Now()
	writeFleet(t, ctx, admin)
	t.Logf("wrote %d Nodes, %d ResourceSlices of %d GPUs and %d allocated claims in %v", bigNodes, bigNodes, gpusPerNode, bigNodes*gpusPerNode/heldEveryNthGP, time.Since(start).Round(time.Millisecond))

	cfg := cp.RESTConfig("fleet-view-test", 50, 100)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: viewerUser}
	view := fleetview.New(kubernetes.NewForConfigOrDie(cfg), fleetview.Options{Driver: bigDriver})
	go view.Run(ctx)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = fleetview.Serve(ctx, l, view.Handler()) }()
	page := "http://" + l.Addr().String() + "/"
	// The server has the model before the page is timed.
	waitFor := time.Now()
	for {
		resp, err := getSnapshot(ctx, page+"api/snapshot")
		if err == nil && resp.nodes == bigNodes && resp.held == bigNodes*gpusPerNode/heldEveryNthGP {
			t.Logf("snapshot: %d nodes, %d KiB, %v after the fleet view started", resp.nodes, resp.bytes>>10, time.Since(waitFor).Round(time.Millisecond))
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the fleet view never had the 1,000 nodes: %v %+v", err, resp)
		}
		time.Sleep(100 * time.Millisecond)
	}

	bctx := browser(t, ctx)
	navigated := time.Now()
	if err := chromedp.Do(bctx,
		chromedp.Navigate(page),
		chromedp.Poll[chromedp.Void](fmt.Sprintf(`window.fleetView.loadedMs !== null && document.querySelectorAll('.node').length === %d`, bigNodes), chromedp.WithPollingTimeout(60*time.Second)),
	); err != nil {
		t.Fatalf("page did not load the %d nodes: %v", bigNodes, err)
	}
	loadedMs, err := chromedp.Run(bctx, chromedp.Evaluate[float64](`window.fleetView.loadedMs`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("page loaded: %d nodes, %d GPUs drawn %.0f ms after navigation started (performance.now); %v from the test's Navigate", bigNodes, bigNodes*gpusPerNode, loadedMs, time.Since(navigated).Round(time.Millisecond))
	if path := os.Getenv("GPUDRA_FLEETVIEW_SCREENSHOT_1000"); path != "" {
		// The top of the page, small enough to commit.
		if err := chromedp.Do(bctx, chromedp.EmulateViewport(1280, 600)); err != nil {
			t.Fatal(err)
		}
		shot, err := chromedp.Run(bctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, shot, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot written to %s (%d bytes)", path, len(shot))
	}
	banner, err := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById('banners').innerText`))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(banner, "Not allowed to list pods") {
		t.Errorf("banners %q: want one naming list on pods", banner)
	}
	held, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll('.gpu.held').length`))
	if err != nil {
		t.Fatal(err)
	}
	if held != bigNodes*gpusPerNode/heldEveryNthGP {
		t.Errorf("%d GPUs drawn as held, want %d", held, bigNodes*gpusPerNode/heldEveryNthGP)
	}

	// One claim released: the page follows.
	c, err := admin.ResourceV1().ResourceClaims("fv").Get(ctx, "c-0500-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Status = resourceapi.ResourceClaimStatus{}
	if _, err := admin.ResourceV1().ResourceClaims("fv").UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	if err := chromedp.Do(bctx, chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.querySelectorAll('.gpu.held').length === %d`, held-1), chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("the released GPU is still drawn held: %v", err)
	}
	deltas, _ := chromedp.Run(bctx, chromedp.Evaluate[int](`window.fleetView.deltas`))
	t.Logf("claim released: page updated %v later, by %d delta event(s), without a reload", time.Since(released).Round(time.Millisecond), deltas)
}

// bindViewerWithoutPods binds the viewer to the shipped ClusterRole with
// pods taken out.
func bindViewerWithoutPods(t *testing.T, ctx context.Context, admin kubernetes.Interface) {
	t.Helper()
	data, err := os.ReadFile("../../../deployments/fleetview/clusterrole.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var role rbacv1.ClusterRole
	if err := yaml.UnmarshalStrict(data, &role); err != nil {
		t.Fatal(err)
	}
	for i := range role.Rules {
		role.Rules[i].Resources = slices.DeleteFunc(role.Rules[i].Resources, func(r string) bool { return r == "pods" })
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name}, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: viewerUser}}}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// writeFleet writes the nodes, their slices and a claim allocated to
// every other GPU.
func writeFleet(t *testing.T, ctx context.Context, admin kubernetes.Interface) {
	t.Helper()
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "fv"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	jobs := make(chan int)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range writeWorkers {
		wg.Go(func() {
			for i := range jobs {
				if err := writeNode(ctx, admin, i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range bigNodes {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d errors writing the fleet, first: %v", len(errs), errs[0])
	}
}

func writeNode(ctx context.Context, admin kubernetes.Interface, i int) error {
	name := fmt.Sprintf("node-%04d", i)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := admin.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return err
	}
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
	slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-gpu"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: bigDriver, NodeName: &name, Pool: resourceapi.ResourcePool{Name: name, ResourceSliceCount: 1}}}
	for g := range gpusPerNode {
		bus := fmt.Sprintf("0000:%02x:00.0", 0x10+g)
		uuid := fmt.Sprintf("GPU-%04d-%d", i, g)
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": str("gpu"), "uuid": str(uuid), "productName": str("NVIDIA H100 80GB HBM3"), "sharingMode": str("none"), "resource.kubernetes.io/pciBusID": str(bus)}
		slice.Spec.Devices = append(slice.Spec.Devices,
			resourceapi.Device{Name: fmt.Sprintf("gpu-%d", g), Attributes: attrs, Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("81559Mi")}}},
			resourceapi.Device{Name: fmt.Sprintf("gpu-vfio-%d", g), Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"type": str("vfio"), "uuid": str(uuid), "resource.kubernetes.io/pciBusID": str(bus)}})
	}
	if _, err := admin.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return err
	}
	for g := 0; g < gpusPerNode; g += heldEveryNthGP {
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "fv", Name: fmt.Sprintf("c-%04d-%d", i, g)}, Spec: resourceapi.ResourceClaimSpec{
			Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}}}}}}
		claim, err := admin.ResourceV1().ResourceClaims("fv").Create(ctx, claim, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: "gpu", Driver: bigDriver, Pool: name, Device: fmt.Sprintf("gpu-%d", g)}}}}
		if _, err := admin.ResourceV1().ResourceClaims("fv").UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("allocate claim %s: %w", claim.Name, err)
		}
	}
	return nil
}

// snapshotCounts reads the fleet view's snapshot: its nodes, the GPUs
// held, and its size.
type snapshotCounts struct{ nodes, held, bytes int }

func getSnapshot(ctx context.Context, url string) (snapshotCounts, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return snapshotCounts{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return snapshotCounts{}, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return snapshotCounts{}, err
	}
	var doc struct{ Nodes []fleetview.Node }
	if err := json.Unmarshal(data, &doc); err != nil {
		return snapshotCounts{}, err
	}
	out := snapshotCounts{nodes: len(doc.Nodes), bytes: len(data)}
	for _, n := range doc.Nodes {
		for _, g := range n.GPUs {
			if len(g.Holders) > 0 {
				out.held++
			}
		}
	}
	return out, nil
}
