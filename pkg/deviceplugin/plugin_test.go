package deviceplugin_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/internal/mpsfake"
	"github.com/gpudra/gpudra/internal/shorttemp"
	"github.com/gpudra/gpudra/pkg/deviceplugin"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/mps"
	"github.com/gpudra/gpudra/pkg/nodemode"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// fakeKubelet is the kubelet's Registration service on kubelet.sock.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	sock   string
	server *grpc.Server
	mu     sync.Mutex
	reqs   []*pluginapi.RegisterRequest
}

func startKubelet(t testing.TB, dir string) *fakeKubelet {
	t.Helper()
	k := &fakeKubelet{sock: filepath.Join(dir, "kubelet.sock")}
	l, err := net.Listen("unix", k.sock)
	if err != nil {
		t.Fatal(err)
	}
	k.server = grpc.NewServer()
	pluginapi.RegisterRegistrationServer(k.server, k)
	go func() { _ = k.server.Serve(l) }()
	t.Cleanup(k.server.Stop)
	return k
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.reqs = append(k.reqs, r)
	return &pluginapi.Empty{}, nil
}

func (k *fakeKubelet) registered() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out []string
	for _, r := range k.reqs {
		out = append(out, r.ResourceName+"@"+r.Endpoint)
	}
	return out
}

// restart is a kubelet restart: it removes every socket in its
// directory (the kubelet's device manager does), and serves a new
// kubelet.sock.
func (k *fakeKubelet) restart(t testing.TB) *fakeKubelet {
	k.server.Stop()
	entries, _ := os.ReadDir(filepath.Dir(k.sock))
	for _, e := range entries {
		_ = os.Remove(filepath.Join(filepath.Dir(k.sock), e.Name()))
	}
	return startKubelet(t, filepath.Dir(k.sock))
}

// testLogger logs through t for tests, and discards for benchmarks.
func testLogger(tb testing.TB) klog.Logger {
	if t, ok := tb.(*testing.T); ok {
		return ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	}
	return klog.NewKlogr().V(10)
}

type rig struct {
	dir, pluginDir, cdiDir string
	kubelet                *fakeKubelet
	plugin                 *deviceplugin.Plugin
	health                 *sim.HealthEvents
	node                   string
	cancel                 context.CancelFunc
	done                   chan error
}

func newRig(t testing.TB, fleet, node string, o deviceplugin.Options, hw ...sim.HardwareOption) *rig {
	t.Helper()
	dir := shorttemp.Dir(t)
	r := &rig{dir: dir, pluginDir: filepath.Join(dir, "device-plugins"), cdiDir: filepath.Join(dir, "cdi"), health: &sim.HealthEvents{}, node: node}
	if err := os.MkdirAll(r.pluginDir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := simfleet.Load(fleet)
	if err != nil {
		t.Fatal(err)
	}
	n, err := f.Node(node)
	if err != nil {
		t.Fatal(err)
	}
	r.kubelet = startKubelet(t, r.pluginDir)
	o.Hardware = n.Hardware(append([]sim.HardwareOption{sim.WithHealthEvents(r.health)}, hw...)...)
	o.DriverName = "gpu.nvidia.com"
	o.PluginDir = r.pluginDir
	o.CDIDir = r.cdiDir
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), testLogger(t)))
	r.cancel = cancel
	r.plugin, err = deviceplugin.New(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	r.done = make(chan error, 1)
	go func() { r.done <- r.plugin.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-r.done //nolint:errcheck // the plugin stops with the context it was given
	})
	return r
}

// client dials a resource's socket once the plugin registered it.
func (r *rig) client(t testing.TB, resource string) pluginapi.DevicePluginClient {
	t.Helper()
	sock := filepath.Join(r.pluginDir, deviceplugin.SocketName(resource))
	waitFor(t, "registration of "+resource, func() bool {
		return slices.Contains(r.kubelet.registered(), resource+"@"+deviceplugin.SocketName(resource))
	})
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

func waitFor(t testing.TB, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFullGPUs serves nvidia.com/gpu on a DGX H100: registration,
// ListAndWatch, GetPreferredAllocation, Allocate with CDI devices that
// resolve through the CDI library to the GPU's device node, and health.
func TestFullGPUs(t *testing.T) {
	r := newRig(t, "dgx-h100", "dgx-h100-0", deviceplugin.Options{DeviceListStrategies: []string{deviceplugin.DeviceListCDICRI, deviceplugin.DeviceListEnvVar}})
	c := r.client(t, deviceplugin.ResourceGPU)
	ctx := context.Background()

	opts, err := c.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil || !opts.GetPreferredAllocationAvailable {
		t.Fatalf("options %v, %v", opts, err)
	}
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Devices) != 8 {
		t.Fatalf("got %d devices, want 8", len(first.Devices))
	}
	var ids []string
	for _, d := range first.Devices {
		if d.Health != pluginapi.Healthy || !strings.HasPrefix(d.ID, "GPU-") || d.Topology == nil || len(d.Topology.Nodes) != 1 {
			t.Errorf("device %+v", d)
		}
		ids = append(ids, d.ID)
	}

	pref, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: ids, AllocationSize: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	picked := pref.ContainerResponses[0].DeviceIDs
	if len(picked) != 2 {
		t.Fatalf("preferred %v", picked)
	}

	alloc, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: picked}}})
	if err != nil {
		t.Fatal(err)
	}
	resp := alloc.ContainerResponses[0]
	if got := resp.Envs["NVIDIA_VISIBLE_DEVICES"]; got != strings.Join(slices.Sorted(slices.Values(picked)), ",") && got != picked[0]+","+picked[1] && got != picked[1]+","+picked[0] {
		t.Errorf("NVIDIA_VISIBLE_DEVICES %q, want %v", got, picked)
	}
	var names []string
	for _, d := range resp.CdiDevices {
		names = append(names, d.Name)
	}
	// The CDI library resolves them from the spec the plugin wrote.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(r.cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI spec errors: %v", errs)
	}
	nodes := map[string]bool{}
	for _, n := range names {
		d := cache.GetDevice(n)
		if d == nil {
			t.Fatalf("CDI device %s does not resolve (have %v)", n, cache.ListDevices())
		}
		for _, dn := range d.ContainerEdits.DeviceNodes {
			nodes[dn.Path] = true
		}
	}
	if len(names) != 2 || len(nodes) != 2 || !strings.HasPrefix(names[0], "k8s.gpu.nvidia.com/device=gpu-") {
		t.Errorf("CDI devices %v with nodes %v, want two GPUs' own nodes", names, nodes)
	}

	if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-nope"}}}}); err == nil || !strings.Contains(err.Error(), `unknown device "GPU-nope"`) {
		t.Errorf("unknown device: %v", err)
	}

	// A fatal XID makes the GPU Unhealthy in ListAndWatch; recovery
	// makes it Healthy again. An application XID changes nothing.
	waitFor(t, "the health watcher", func() bool { return r.health.Watched(r.node, 3) })
	inject := func(e sim.HealthEvent) {
		if err := r.health.Inject(r.node, 3, e); err != nil {
			t.Fatal(err)
		}
	}
	health := func() string {
		t.Helper()
		msg, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var bad []string
		for _, d := range msg.Devices {
			if d.Health != pluginapi.Healthy {
				bad = append(bad, d.ID)
			}
		}
		return strings.Join(bad, ",")
	}
	inject(sim.HealthEvent{Kind: sim.InjectXID, XID: 79})
	if got := health(); got != first.Devices[3].ID {
		t.Errorf("after XID 79 on GPU 3: unhealthy %q, want %s", got, first.Devices[3].ID)
	}
	if _, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{first.Devices[3].ID}}}}); err == nil || !strings.Contains(err.Error(), "unhealthy") {
		t.Errorf("allocating the unhealthy GPU: %v", err)
	}
	inject(sim.HealthEvent{Kind: sim.InjectRecover})
	if got := health(); got != "" {
		t.Errorf("after recovery: unhealthy %q", got)
	}
}

// TestKubeletRestart: the kubelet removes the plugin's sockets and comes
// back with a new kubelet.sock; the plugin serves and registers again.
func TestKubeletRestart(t *testing.T) {
	r := newRig(t, "dgx-h100", "dgx-h100-0", deviceplugin.Options{})
	r.client(t, deviceplugin.ResourceGPU)
	r.kubelet = r.kubelet.restart(t)
	c := r.client(t, deviceplugin.ResourceGPU)
	stream, err := c.ListAndWatch(context.Background(), &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if msg, err := stream.Recv(); err != nil || len(msg.Devices) != 8 {
		t.Fatalf("after the restart: %v, %v", msg, err)
	}
	if n := r.plugin.Registrations(); n != 2 {
		t.Errorf("registered %d times, want 2", n)
	}
	if sock := nodemode.DevicePluginListening(r.pluginDir); !strings.HasSuffix(sock, deviceplugin.SocketName(deviceplugin.ResourceGPU)) {
		t.Errorf("nodemode sees %q", sock)
	}
}

// TestMixedAndTimeSlicing serves MIG resources under the mixed strategy
// and time-sliced GPUs, and refuses more than one replica when told to.
func TestMixedAndTimeSlicing(t *testing.T) {
	cfg, err := deviceplugin.ParseConfig([]byte(`
version: v1
flags: {migStrategy: mixed}
sharing:
  timeSlicing:
    failRequestsGreaterThanOne: true
    resources:
    - {name: nvidia.com/gpu, replicas: 4}
`))
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, "dgx-a100-mig", "dgx-a100-0", deviceplugin.Options{Plan: deviceplugin.PlanOptions{MIGStrategy: *cfg.Flags.MigStrategy, TimeSlicing: cfg.Sharing.TimeSlicing}})
	var names []string
	for _, res := range r.plugin.Resources() {
		names = append(names, res.Name)
	}
	if got := strings.Join(names, " "); got != "nvidia.com/gpu nvidia.com/mig-1g.5gb nvidia.com/mig-2g.10gb nvidia.com/mig-3g.20gb nvidia.com/mig-4g.20gb nvidia.com/mig-7g.40gb" {
		t.Errorf("resources %s", got)
	}
	ctx := context.Background()
	mig := r.client(t, deviceplugin.MIGResource("1g.5gb"))
	stream, err := mig.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.Recv()
	if err != nil || len(msg.Devices) != 9 {
		t.Fatalf("1g.5gb devices: %v, %v", msg, err)
	}
	alloc, err := mig.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{msg.Devices[0].ID}}}})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(r.cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	d := cache.GetDevice(alloc.ContainerResponses[0].CdiDevices[0].Name)
	if d == nil {
		t.Fatalf("%s does not resolve", alloc.ContainerResponses[0].CdiDevices[0].Name)
	}
	caps := 0
	for _, n := range d.ContainerEdits.DeviceNodes {
		if strings.HasPrefix(n.Path, "/dev/nvidia-caps/") {
			caps++
		}
	}
	if caps != 2 {
		t.Errorf("a MIG device's CDI device has %d capability nodes, want 2: %+v", caps, d.ContainerEdits.DeviceNodes)
	}

	gpu := r.client(t, deviceplugin.ResourceGPU)
	stream, err = gpu.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	if msg, err = stream.Recv(); err != nil || len(msg.Devices) != 16 {
		t.Fatalf("time-sliced GPUs: %v, %v", msg, err)
	}
	one, err := gpu.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{msg.Devices[0].ID}}}})
	if err != nil || len(one.ContainerResponses[0].CdiDevices) != 1 {
		t.Fatalf("one replica: %v, %v", one, err)
	}
	if _, err := gpu.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{msg.Devices[0].ID, msg.Devices[1].ID}}}}); err == nil || !strings.Contains(err.Error(), "failRequestsGreaterThanOne") {
		t.Errorf("two replicas: %v", err)
	}
}

// TestMPSReplicas: sharing.mps starts an MPS daemon per GPU with each
// client capped at 1/replicas, and a replica's container gets the GPU and
// its daemon's pipe directory through CDI.
func TestMPSReplicas(t *testing.T) {
	cfg, err := deviceplugin.ParseConfig([]byte("version: v1\nsharing: {mps: {renameByDefault: true, resources: [{name: nvidia.com/gpu, replicas: 4, devices: [0, 1]}]}}"))
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(shorttemp.Dir(t), "mps")
	m, err := mps.New(root, mps.WithControlBinary(filepath.Join(fakeMPSBin, mpsfake.ControlName)))
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, "dgx-h100", "dgx-h100-0", deviceplugin.Options{MPS: m, Plan: deviceplugin.PlanOptions{MPS: *cfg.Sharing.MPS}})
	var names []string
	for _, res := range r.plugin.Resources() {
		names = append(names, fmt.Sprintf("%s:%d", res.Name, len(res.Devices)))
	}
	if got := strings.Join(names, " "); got != "nvidia.com/gpu:6 nvidia.com/gpu.shared:8" {
		t.Errorf("resources %s", got)
	}
	for _, gpu := range []int{0, 1} {
		dirs := m.Dirs(fmt.Sprintf("device-plugin-gpu-%d", gpu))
		rec, err := mpsfake.ReadRecord(dirs.Log)
		if err != nil {
			t.Fatalf("GPU %d: no MPS daemon: %v", gpu, err)
		}
		uuid := r.plugin.Resources()[1].Devices[gpu*4].UUID()
		if rec.ActiveThreadPercentage == nil || *rec.ActiveThreadPercentage != 25 || rec.PinnedMemLimitMiB[uuid] != 81559/4 {
			t.Errorf("GPU %d's daemon: threads %v, pinned %v; want 25%% and %d MiB", gpu, rec.ActiveThreadPercentage, rec.PinnedMemLimitMiB, 81559/4)
		}
	}
	c := r.client(t, "nvidia.com/gpu.shared")
	alloc, err := c.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{r.plugin.Resources()[1].Devices[5].ID}}}})
	if err != nil {
		t.Fatal(err)
	}
	cdiDevs := alloc.ContainerResponses[0].CdiDevices
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(r.cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if len(cdiDevs) != 1 || cdiDevs[0].Name != "k8s.gpu.nvidia.com/device=gpu-1-mps" {
		t.Fatalf("CDI devices %v, want gpu-1-mps", cdiDevs)
	}
	d := cache.GetDevice(cdiDevs[0].Name)
	if d == nil {
		t.Fatalf("%s does not resolve", cdiDevs[0].Name)
	}
	pipe := m.Dirs("device-plugin-gpu-1").Pipe
	if !slices.ContainsFunc(d.ContainerEdits.Mounts, func(mt *cdispec.Mount) bool { return mt.HostPath == pipe && mt.ContainerPath == mps.ContainerPipeDir }) {
		t.Errorf("gpu-1-mps mounts %+v, want the daemon's pipe directory %s", d.ContainerEdits.Mounts, pipe)
	}

	// Without MPS daemons the config is refused, naming the field.
	f, _ := simfleet.Load("dgx-h100")
	n, _ := f.Node("dgx-h100-0")
	dir := t.TempDir()
	if _, err := deviceplugin.New(context.Background(), deviceplugin.Options{Hardware: n.Hardware(), DriverName: "gpu.nvidia.com", PluginDir: dir, CDIDir: dir,
		Plan: deviceplugin.PlanOptions{MPS: *cfg.Sharing.MPS}}); err == nil || !strings.Contains(err.Error(), "sharing.mps") {
		t.Errorf("MPS replicas without an MPS manager: %v", err)
	}
}

// TestMPSReplicasOfGPUWithUnreadMemory: a GPU whose memory discovery
// could not read (GB10's unified memory) is still MPS-shared, its clients'
// SMs capped, their memory not: a cap of 0 would leave them none.
func TestMPSReplicasOfGPUWithUnreadMemory(t *testing.T) {
	cfg, err := deviceplugin.ParseConfig([]byte("version: v1\nsharing: {mps: {renameByDefault: true, resources: [{name: nvidia.com/gpu, replicas: 4, devices: [0, 1]}]}}"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := mps.New(filepath.Join(shorttemp.Dir(t), "mps"), mps.WithControlBinary(filepath.Join(fakeMPSBin, mpsfake.ControlName)))
	if err != nil {
		t.Fatal(err)
	}
	faults := &sim.Faults{}
	faults.Fail("nvmlDeviceGetMemoryInfo", 1, nvml.ERROR_NOT_SUPPORTED) // GPU 0's, at the first discovery
	r := newRig(t, "dgx-h100", "dgx-h100-0", deviceplugin.Options{MPS: m, Plan: deviceplugin.PlanOptions{MPS: *cfg.Sharing.MPS}}, sim.WithFaults(faults))
	for gpu, pinned := range map[int]int64{0: 0, 1: 81559 / 4} {
		rec, err := mpsfake.ReadRecord(m.Dirs(fmt.Sprintf("device-plugin-gpu-%d", gpu)).Log)
		if err != nil {
			t.Fatalf("GPU %d: no MPS daemon: %v", gpu, err)
		}
		uuid := r.plugin.Resources()[1].Devices[gpu*4].UUID()
		if got, capped := rec.PinnedMemLimitMiB[uuid]; rec.ActiveThreadPercentage == nil || *rec.ActiveThreadPercentage != 25 || got != pinned || capped != (pinned > 0) {
			t.Errorf("GPU %d's daemon: threads %v, pinned %v; want 25%% and %d MiB (0: uncapped)", gpu, rec.ActiveThreadPercentage, rec.PinnedMemLimitMiB, pinned)
		}
	}
}

func TestNewRefusesWhatTheNodeCannotServe(t *testing.T) {
	f, err := simfleet.Load("dgx-a100-mig")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := f.Node("dgx-a100-0")
	dir := t.TempDir()
	_, err = deviceplugin.New(context.Background(), deviceplugin.Options{
		Hardware: n.Hardware(), DriverName: "gpu.nvidia.com", PluginDir: dir, CDIDir: dir,
		Plan: deviceplugin.PlanOptions{MIGStrategy: deviceplugin.MIGStrategySingle},
	})
	if err == nil || !strings.Contains(err.Error(), "flags.migStrategy single") {
		t.Errorf("single strategy on a mixed node: %v", err)
	}
}
