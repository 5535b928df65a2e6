package containerruntime_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/gpudra/gpudra/localcluster/realnode/containerruntime"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// realNode skips the test unless GPUDRA_REAL_NODE=1 (make test-real-node):
// it builds containerd (minutes when cold) and runs containers as root.
func realNode(t *testing.T) {
	t.Helper()
	if os.Getenv("GPUDRA_REAL_NODE") != "1" {
		t.Skip("builds containerd and runs real containers: set GPUDRA_REAL_NODE=1 (make test-real-node)")
	}
	if err := containerruntime.CheckMachine(t.TempDir()); err != nil {
		t.Fatal(err)
	}
}

// binaries builds (or reuses) the runtime's programs in
// $GPUDRA_REAL_NODE_BIN or the user's cache directory.
func binaries(t *testing.T, ctx context.Context) containerruntime.Binaries {
	t.Helper()
	dir := os.Getenv("GPUDRA_REAL_NODE_BIN")
	if dir == "" {
		var err error
		if dir, err = containerruntime.DefaultBinariesDir(); err != nil {
			t.Fatal(err)
		}
	}
	b, err := containerruntime.BuildBinaries(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testNode is a started runtime with the test image imported, and a CRI
// client.
type testNode struct {
	rt      *containerruntime.Runtime
	cri     runtimeapi.RuntimeServiceClient
	podCIDR *net.IPNet
	logs    string
}

// startNode starts a runtime under dir/node with the CDI spec directory
// cdiDir, on a bridge and pod network of its own (named after the test
// process, so that two test processes on one machine do not share one),
// imports the test image, and stops the runtime when the test ends.
func startNode(t *testing.T, ctx context.Context, dir, cdiDir string) *testNode {
	t.Helper()
	b := binaries(t, ctx)
	pid := os.Getpid()
	_, podCIDR, err := net.ParseCIDR(fmt.Sprintf("10.%d.%d.0/24", 100+pid/256%100, pid%256))
	if err != nil {
		t.Fatal(err)
	}
	rt, err := containerruntime.Start(ctx, containerruntime.Config{
		Dir:      filepath.Join(dir, "node"),
		CDIDirs:  []string{cdiDir},
		Binaries: b,
		PodCIDR:  podCIDR.String(),
		Bridge:   fmt.Sprintf("gpudt%d", pid%10000000),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	image, err := containerruntime.WriteTestImage(filepath.Join(dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Import(ctx, image); err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(rt.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &testNode{rt: rt, cri: runtimeapi.NewRuntimeServiceClient(conn), podCIDR: podCIDR, logs: filepath.Join(dir, "logs")}
}

// run runs a pod sandbox named pod with one container configured by cfg
// (its image, command and CDI devices), checks the pod's address is in
// the node's pod network, waits for the container to exit 0, and returns
// its output lines (from its CRI log). The pod is removed when the test
// ends.
func (n *testNode) run(t *testing.T, ctx context.Context, pod string, cfg *runtimeapi.ContainerConfig) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cri := n.cri
	logDir := filepath.Join(n.logs, pod)
	// As the kubelet does with the cgroupfs driver: a pod cgroup below
	// a QoS cgroup, and a container with CPU and memory limits and a
	// Guaranteed pod's OOM score adjustment (which containerd restricts
	// to its own score: the machines lack CAP_SYS_RESOURCE).
	cgroupParent := fmt.Sprintf("/gpudra-realnode-test-%d/pod%s", os.Getpid(), pod)
	t.Cleanup(func() { removeCgroups(t, filepath.Dir(cgroupParent)) })
	sandboxCfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: pod, Namespace: "default", Uid: pod + "-uid"},
		LogDirectory: logDir,
		Linux:        &runtimeapi.LinuxPodSandboxConfig{CgroupParent: cgroupParent},
	}
	sb, err := cri.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sandboxCfg})
	if err != nil {
		t.Fatalf("run pod sandbox: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := cri.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
			t.Errorf("stop pod sandbox: %v", err)
		}
		if _, err := cri.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId}); err != nil {
			t.Errorf("remove pod sandbox: %v", err)
		}
	})
	st, err := cri.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb.PodSandboxId})
	if err != nil {
		t.Fatalf("pod sandbox status: %v", err)
	}
	// The pod network: an address given by the bridge and host-local
	// plugins.
	if ip := net.ParseIP(st.GetStatus().GetNetwork().GetIp()); ip == nil || !n.podCIDR.Contains(ip) {
		t.Fatalf("pod IP %q, want one in %s", st.GetStatus().GetNetwork().GetIp(), n.podCIDR)
	}
	cfg.Metadata = &runtimeapi.ContainerMetadata{Name: "main"}
	cfg.LogPath = "main.log"
	if cfg.Linux == nil {
		cfg.Linux = &runtimeapi.LinuxContainerConfig{Resources: &runtimeapi.LinuxContainerResources{
			CpuShares:          512,
			CpuPeriod:          100000,
			CpuQuota:           50000,
			MemoryLimitInBytes: 256 << 20,
			OomScoreAdj:        -997,
		}}
	}
	c, err := cri.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, SandboxConfig: sandboxCfg, Config: cfg})
	if err != nil {
		t.Fatalf("create container: %v", err)
	}
	if _, err := cri.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: c.ContainerId}); err != nil {
		t.Fatalf("start container: %v", err)
	}
	for {
		st, err := cri.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: c.ContainerId})
		if err != nil {
			t.Fatalf("container status: %v", err)
		}
		if s := st.Status; s.State == runtimeapi.ContainerState_CONTAINER_EXITED {
			lines := readCRILog(t, filepath.Join(logDir, cfg.LogPath))
			if s.ExitCode != 0 {
				t.Fatalf("container exited %d (%s %s):\n%s", s.ExitCode, s.Reason, s.Message, strings.Join(lines, "\n"))
			}
			t.Logf("container output:\n%s", strings.Join(lines, "\n"))
			return lines
		}
		select {
		case <-ctx.Done():
			t.Fatalf("container did not exit: %v", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// removeCgroups removes the cgroup dir and the pod cgroups below it in
// every cgroup v1 hierarchy (or the v2 tree), once containerd has removed
// the containers' own.
func removeCgroups(t *testing.T, dir string) {
	t.Helper()
	roots, err := filepath.Glob("/sys/fs/cgroup/*")
	if err != nil {
		t.Fatal(err)
	}
	roots = append(roots, "/sys/fs/cgroup")
	for _, root := range roots {
		pods, _ := filepath.Glob(filepath.Join(root, dir, "*"))
		for _, p := range pods {
			if fi, err := os.Stat(p); err == nil && fi.IsDir() {
				if err := os.Remove(p); err != nil {
					t.Errorf("remove cgroup: %v", err)
				}
			}
		}
		if err := os.Remove(filepath.Join(root, dir)); err != nil && !os.IsNotExist(err) {
			t.Errorf("remove cgroup: %v", err)
		}
	}
}

// readCRILog returns the lines of a CRI container log ("<time> <stream>
// <tag> <line>").
func readCRILog(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.SplitN(s.Text(), " ", 4)
		if len(fields) == 4 {
			lines = append(lines, fields[3])
		}
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return lines
}

// simNode is the simulated DGX A100 with MIG devices on GPU 1.
type simNode struct {
	inv   *hardware.Inventory
	model *devicemodel.Model
}

func loadNode(t *testing.T) simNode {
	t.Helper()
	inv, err := simfleet.Discover(context.Background(), "dgx-a100-mig", "dgx-a100-0")
	if err != nil {
		t.Fatal(err)
	}
	m, err := devicemodel.Build(inv)
	if err != nil {
		t.Fatal(err)
	}
	return simNode{inv: inv, model: m}
}

func (n simNode) device(t *testing.T, name string) *devicemodel.Device {
	t.Helper()
	d, ok := n.model.Lookup(name)
	if !ok {
		t.Fatalf("no device %s on the node", name)
	}
	return d
}

// migOn is the first MIG device of the GPU with the given minor.
func (n simNode) migOn(t *testing.T, minor int) *devicemodel.Device {
	t.Helper()
	for i := range n.model.Devices {
		if d := &n.model.Devices[i]; d.MIG != nil && d.GPU.Minor == minor {
			return d
		}
	}
	t.Fatalf("no MIG device on GPU %d", minor)
	return nil
}
