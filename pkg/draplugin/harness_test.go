package draplugin_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/gpudra/gpudra/internal/shorttemp"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

const (
	driverName = "gpu.nvidia.com"
	nodeName   = "dgx-h100-0"
)

// harness runs the plugin on the kubeletplugin helper with real sockets in
// a short temporary directory, against a fake clientset, and talks to it
// over DRA gRPC v1 as the kubelet does.
type harness struct {
	tb      testing.TB
	dir     string
	client  *fake.Clientset
	cfg     draplugin.Config
	driver  *draplugin.Driver
	conn    *grpc.ClientConn
	dra     drapb.DRAPluginClient
	ctx     context.Context
	cancel  context.CancelFunc
	claimNo atomic.Int64
}

// newHarness starts the plugin on the dgx-h100 fleet's node, in a
// directory short enough for its sockets (package shorttemp).
func newHarness(tb testing.TB, mutate ...func(*draplugin.Config)) *harness {
	tb.Helper()
	return newHarnessIn(tb, shorttemp.Dir(tb), mutate...)
}

// newHarnessIn starts the plugin on directories under dir, which may hold
// the state of an earlier plugin process.
func newHarnessIn(tb testing.TB, dir string, mutate ...func(*draplugin.Config)) *harness {
	tb.Helper()
	for _, sub := range []string{"plugin", "registry", "cdi"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	bootID := filepath.Join(dir, "boot_id")
	if err := os.WriteFile(bootID, []byte("boot-1\n"), 0o644); err != nil {
		tb.Fatal(err)
	}
	fleet, err := simfleet.Load("dgx-h100")
	if err != nil {
		tb.Fatal(err)
	}
	node, err := fleet.Node(nodeName)
	if err != nil {
		tb.Fatal(err)
	}
	h := &harness{
		tb:  tb,
		dir: dir,
	}
	h.cfg = draplugin.Config{
		DriverName:    driverName,
		NodeName:      nodeName,
		Hardware:      node.Hardware(),
		PluginDataDir: filepath.Join(dir, "plugin"),
		RegistrarDir:  filepath.Join(dir, "registry"),
		CDIDir:        filepath.Join(dir, "cdi"),
		BootIDPath:    bootID,
	}
	for _, m := range mutate {
		m(&h.cfg)
	}
	if client, ok := h.cfg.KubeClient.(*fake.Clientset); ok {
		h.client = client // an earlier harness's API server
	} else {
		h.client = newFakeClient(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: h.cfg.NodeName, UID: "node-uid"}})
		h.cfg.KubeClient = h.client
	}
	h.start()
	tb.Cleanup(h.stop)
	return h
}

// newFakeClient is a fake clientset that, like the API server, names
// objects created with generateName: a pool of several ResourceSlices needs
// it.
func newFakeClient(objects ...runtime.Object) *fake.Clientset {
	client := fake.NewClientset(objects...)
	var n atomic.Int64
	client.PrependReactor("create", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		obj, ok := action.(k8stesting.CreateAction).GetObject().(metav1.Object)
		if ok && obj.GetName() == "" && obj.GetGenerateName() != "" {
			obj.SetName(fmt.Sprintf("%s%05d", obj.GetGenerateName(), n.Add(1)))
		}
		if isDryRun(action) {
			// The API server answers a dry run with what it would store,
			// and stores nothing; the fake's tracker would store it.
			return true, action.(k8stesting.CreateAction).GetObject(), nil
		}
		return false, nil, nil
	})
	return client
}

// isDryRun reports whether action is a dry-run create.
func isDryRun(action k8stesting.Action) bool {
	a, ok := action.(k8stesting.CreateActionImpl)
	return ok && len(a.CreateOptions.DryRun) > 0
}

// withReactor gives the plugin a fake API server with fn prepended for
// verb and resource, installed before the plugin starts (a reactor added
// later races with the plugin's calls).
func withReactor(verb, resource string, fn k8stesting.ReactionFunc) func(*draplugin.Config) {
	return func(cfg *draplugin.Config) {
		client, ok := cfg.KubeClient.(*fake.Clientset)
		if !ok {
			client = newFakeClient(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName, UID: "node-uid"}})
			cfg.KubeClient = client
		}
		client.PrependReactor(verb, resource, fn)
	}
}

// withFleet runs the plugin on a node of another fleet: a built-in name
// or YAML text.
func withFleet(tb testing.TB, fleetNameOrYAML, node string) func(*draplugin.Config) {
	return func(cfg *draplugin.Config) {
		tb.Helper()
		fleet, err := simfleet.Load(fleetNameOrYAML)
		if err != nil {
			fleet, err = simfleet.Parse([]byte(fleetNameOrYAML), "test")
		}
		if err != nil {
			tb.Fatal(err)
		}
		n, err := fleet.Node(node)
		if err != nil {
			tb.Fatal(err)
		}
		cfg.Hardware = n.Hardware()
		cfg.NodeName = node
		cfg.MIGMode = draplugin.MIGMode(n.MIGMode)
	}
}

func (h *harness) start() {
	h.tb.Helper()
	var logger klog.Logger
	if t, ok := h.tb.(*testing.T); ok {
		logger = ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2), ktesting.BufferLogs(true)))
	} else {
		logger = klog.NewKlogr().V(10) // benchmarks: quiet
	}
	h.ctx, h.cancel = context.WithCancel(klog.NewContext(context.Background(), logger))
	driver, err := draplugin.Start(h.ctx, h.cfg)
	if err != nil {
		h.tb.Fatalf("start plugin: %v", err)
	}
	h.driver = driver
	conn, err := grpc.NewClient("unix://"+h.draSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		h.tb.Fatal(err)
	}
	h.conn = conn
	h.dra = drapb.NewDRAPluginClient(conn)
}

// draSocket is where the helper serves DRA gRPC: dra.sock, or with rolling
// updates dra-<pod UID>.sock.
func (h *harness) draSocket() string {
	name := "dra.sock"
	if h.cfg.RollingUpdateUID != "" {
		name = "dra-" + string(h.cfg.RollingUpdateUID) + ".sock"
	}
	return filepath.Join(h.cfg.PluginDataDir, name)
}

func (h *harness) stop() {
	if h.driver == nil {
		return
	}
	_ = h.conn.Close()
	h.driver.Stop()
	h.cancel()
	h.driver = nil
}

// restart stops the plugin and starts a new one on the same directories,
// as after a crash or an upgrade.
func (h *harness) restart() {
	h.stop()
	h.start()
}

// claim creates an allocated claim for the given devices of our driver,
// reserved for one pod.
func (h *harness) claim(devices ...string) *resourceapi.ResourceClaim {
	h.tb.Helper()
	n := h.claimNo.Add(1)
	return h.claimFor(fmt.Sprintf("claim-%d", n), types.UID(fmt.Sprintf("00000000-0000-0000-0000-%012d", n)), devices...)
}

// claimFor creates an allocated claim with the given name and UID.
func (h *harness) claimFor(name string, uid types.UID, devices ...string) *resourceapi.ResourceClaim {
	h.tb.Helper()
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: uid},
		Status: resourceapi.ResourceClaimStatus{
			Allocation:  &resourceapi.AllocationResult{},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-of-" + name, UID: "pod-uid-of-" + uid}},
		},
	}
	for i, d := range devices {
		claim.Status.Allocation.Devices.Results = append(claim.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: fmt.Sprintf("gpu%d", i), Driver: driverName, Pool: h.cfg.NodeName, Device: d,
		})
	}
	return h.create(claim)
}

func podObject(name, uid string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(uid)}}
}

func (h *harness) create(claim *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	h.tb.Helper()
	created, err := h.client.ResourceV1().ResourceClaims(claim.Namespace).Create(context.Background(), claim, metav1.CreateOptions{})
	if err != nil {
		h.tb.Fatal(err)
	}
	return created
}

// withConfig adds an opaque config of our driver to the claim's allocation.
func withConfig(claim *resourceapi.ResourceClaim, source resourceapi.AllocationConfigSource, requests []string, params string) {
	claim.Status.Allocation.Devices.Config = append(claim.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
		Source:   source,
		Requests: requests,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driverName, Parameters: runtime.RawExtension{Raw: []byte(params)},
		}},
	})
}

func pbClaims(claims ...*resourceapi.ResourceClaim) []*drapb.Claim {
	out := make([]*drapb.Claim, len(claims))
	for i, c := range claims {
		out[i] = &drapb.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
	}
	return out
}

func (h *harness) prepare(claims ...*resourceapi.ResourceClaim) *drapb.NodePrepareResourcesResponse {
	h.tb.Helper()
	resp, err := h.dra.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: pbClaims(claims...)})
	if err != nil {
		h.tb.Fatalf("NodePrepareResources: %v", err)
	}
	return resp
}

func (h *harness) unprepare(claims ...*resourceapi.ResourceClaim) *drapb.NodeUnprepareResourcesResponse {
	h.tb.Helper()
	resp, err := h.dra.NodeUnprepareResources(context.Background(), &drapb.NodeUnprepareResourcesRequest{Claims: pbClaims(claims...)})
	if err != nil {
		h.tb.Fatalf("NodeUnprepareResources: %v", err)
	}
	return resp
}

// mustPrepare prepares one claim and fails the test on a per-claim error.
func (h *harness) mustPrepare(claim *resourceapi.ResourceClaim) *drapb.NodePrepareResourceResponse {
	h.tb.Helper()
	r := h.prepare(claim).Claims[string(claim.UID)]
	if r == nil {
		h.tb.Fatalf("no result for claim %s", claim.UID)
	}
	if r.Error != "" {
		h.tb.Fatalf("prepare %s: %s", claim.Name, r.Error)
	}
	return r
}

func (h *harness) mustUnprepare(claim *resourceapi.ResourceClaim) {
	h.tb.Helper()
	r := h.unprepare(claim).Claims[string(claim.UID)]
	if r == nil || r.Error != "" {
		h.tb.Fatalf("unprepare %s: %v", claim.Name, r)
	}
}

// specFiles lists the files in the CDI directory.
func (h *harness) specFiles() []string {
	h.tb.Helper()
	entries, err := os.ReadDir(h.cfg.CDIDir)
	if err != nil {
		h.tb.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if !e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names
}

// checkpoint returns the raw checkpoint file.
func (h *harness) checkpoint() string {
	h.tb.Helper()
	data, err := os.ReadFile(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json"))
	if err != nil && !os.IsNotExist(err) {
		h.tb.Fatal(err)
	}
	return string(data)
}
