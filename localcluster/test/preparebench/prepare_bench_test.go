// Package preparebench measures a one-claim Prepare against a real
// kube-apiserver (the local cluster's etcd and API server, in process),
// beside pkg/draplugin's BenchmarkPrepareOneClaim over a fake clientset: the
// kubeletplugin helper GETs the claim from the API server on every call,
// and that GET is part of what users see. It also measures the plugin's
// start to its ResourceSlices (start_bench_test.go).
package preparebench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/simfleet"

	"github.com/gpudra/gpudra/localcluster/controlplane"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

const (
	driver = "gpu.nvidia.com"
	node   = "bench-0"
)

// BenchmarkPrepareOneClaimRealAPIServer: one NodePrepareResources call
// with one full-GPU claim over gRPC, the plugin's client talking to a real
// kube-apiserver on loopback (with seven other claims prepared, as in
// pkg/draplugin's benchmark); Unprepare runs outside the timer.
func BenchmarkPrepareOneClaimRealAPIServer(b *testing.B) {
	ctx, client, n := startBench(b)
	cfg := pluginConfig(b, client, n)
	if shm, err := os.MkdirTemp("/dev/shm", "gpudra-cdi"); err == nil {
		defer os.RemoveAll(shm)
		cfg.CDIDir = shm // /var/run/cdi is on tmpfs on a real node
	}
	for _, d := range []string{cfg.PluginDataDir, cfg.RegistrarDir, cfg.CDIDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	d, err := draplugin.Start(klog.NewContext(ctx, klog.NewKlogr().V(10)), cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer d.Stop()
	conn, err := grpc.NewClient("unix://"+filepath.Join(cfg.PluginDataDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	dra := drapb.NewDRAPluginClient(conn)

	claims := make([]*drapb.Claim, 8)
	for i := range claims {
		claims[i] = createClaim(ctx, b, client, i)
		prepare(ctx, b, dra, claims[i])
	}
	unprepare(ctx, b, dra, claims[0])
	b.ResetTimer()
	for b.Loop() {
		prepare(ctx, b, dra, claims[0])
		b.StopTimer()
		unprepare(ctx, b, dra, claims[0])
		b.StartTimer()
	}
}

// createClaim creates a claim allocated gpu-i of the node, reserved for a
// pod, as the scheduler leaves it.
func createClaim(ctx context.Context, b *testing.B, client kubernetes.Interface, i int) *drapb.Claim {
	b.Helper()
	claim, err := client.ResourceV1().ResourceClaims("default").Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", i)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	claim.Status = resourceapi.ResourceClaimStatus{
		Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: driver, Pool: node, Device: fmt.Sprintf("gpu-%d", i),
		}}}},
		ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: fmt.Sprintf("pod-%d", i), UID: "pod-uid"}},
	}
	claim, err = client.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return &drapb.Claim{Namespace: claim.Namespace, Name: claim.Name, Uid: string(claim.UID)}
}

func prepare(ctx context.Context, b *testing.B, dra drapb.DRAPluginClient, c *drapb.Claim) {
	resp, err := dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: []*drapb.Claim{c}})
	if err != nil {
		b.Fatal(err)
	}
	if r := resp.Claims[c.Uid]; r == nil || r.Error != "" {
		b.Fatalf("prepare %s: %v", c.Name, r)
	}
}

func unprepare(ctx context.Context, b *testing.B, dra drapb.DRAPluginClient, c *drapb.Claim) {
	resp, err := dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: []*drapb.Claim{c}})
	if err != nil {
		b.Fatal(err)
	}
	if r := resp.Claims[c.Uid]; r == nil || r.Error != "" {
		b.Fatalf("unprepare %s: %v", c.Name, r)
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// startBench starts a control plane for a benchmark, with the Node object
// of the benchmark's node, and returns a client and the node's simulated
// hardware: eight H100s. Everything stops when the benchmark ends.
func startBench(b *testing.B) (context.Context, kubernetes.Interface, *simfleet.Node) {
	b.Helper()
	klog.SetOutput(discard{})
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cp.Stop() })
	client, err := kubernetes.NewForConfig(cp.RESTConfig("bench", 1000, 2000))
	if err != nil {
		b.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	fleet, err := simfleet.Parse([]byte("nodes:\n- name: bench-0\n  gpus: [{model: H100-SXM5-80GB}, {model: H100-SXM5-80GB}, {model: H100-SXM5-80GB}, {model: H100-SXM5-80GB}, {model: H100-SXM5-80GB}, {model: H100-SXM5-80GB}, {model: H100-SXM5-80GB}, {model: H100-SXM5-80GB}]\n"), "bench")
	if err != nil {
		b.Fatal(err)
	}
	n, err := fleet.Node(node)
	if err != nil {
		b.Fatal(err)
	}
	return ctx, client, n
}

// pluginConfig is the plugin's config for the benchmark's node, in a new
// directory of its own: static MIG, a boot ID file of its own.
func pluginConfig(b *testing.B, client kubernetes.Interface, n *simfleet.Node) draplugin.Config {
	b.Helper()
	dir := clustertest.ShortTempDir(b)
	boot := filepath.Join(dir, "boot_id")
	if err := os.WriteFile(boot, []byte("boot-1\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	return draplugin.Config{
		DriverName: driver, NodeName: node, KubeClient: client, Hardware: n.Hardware(),
		PluginDataDir: filepath.Join(dir, "plugin"), RegistrarDir: filepath.Join(dir, "registry"),
		CDIDir: filepath.Join(dir, "cdi"), BootIDPath: boot, MIGMode: draplugin.MIGModeStatic,
	}
}
