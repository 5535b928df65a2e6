package containerruntime_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2/ktesting"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/localcluster/realnode/containerruntime"
	"github.com/gpudra/gpudra/localcluster/realnode/devnodes"
	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/mps"
)

const driverName = "gpu.nvidia.com"

// podCIDR is the runtime's default pod network.
var podCIDR = &net.IPNet{IP: net.IPv4(10, 88, 0, 0), Mask: net.CIDRMask(24, 32)}

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

// TestContainersSeeTheirDevices starts containerd on a simulated DGX A100
// node (GPU 1 in MIG mode), writes gpudra's CDI specs for claims of one
// GPU, one MIG device and one MPS-shared GPU, and runs a busybox container
// per claim through the CRI with the claim's CDI devices. Each container
// lists its /dev/nvidia* and /dev/nvidia-caps nodes, its environment and
// its mounts; the test checks it sees exactly its device's nodes and the
// control nodes, the spec's environment, and (MPS) the daemon's pipe
// directory with a file the host put there.
func TestContainersSeeTheirDevices(t *testing.T) {
	realNode(t)
	_, ctx := ktesting.NewTestContext(t)
	b := binaries(t, ctx)

	node := loadNode(t)
	dir := t.TempDir()
	devRoot := filepath.Join(dir, "devroot")
	nodes, err := devnodes.Nodes(node.inv, devnodes.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := devnodes.Create(devRoot, nodes); err != nil {
		t.Fatal(err)
	}
	cdiDir := filepath.Join(dir, "cdi")
	rt, err := containerruntime.Start(ctx, containerruntime.Config{
		Dir:      filepath.Join(dir, "node"),
		CDIDirs:  []string{cdiDir},
		Binaries: b,
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
	writer, err := cdi.NewWriter(cdiDir, driverName)
	if err != nil {
		t.Fatal(err)
	}

	mig := node.migOn(t, 1)
	mpsDirs := mps.DirsOf(filepath.Join(dir, "mps"), "claim-mps")
	for _, d := range []string{mpsDirs.Pipe, mpsDirs.Log, mpsDirs.Shm} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(mpsDirs.Pipe, "control"), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	allGPUNodes := []string{"/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2", "/dev/nvidia3", "/dev/nvidia4", "/dev/nvidia5", "/dev/nvidia6", "/dev/nvidia7"}
	control := []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"}
	tests := []struct {
		name      string
		device    *devicemodel.Device
		edits     *cdispec.ContainerEdits
		wantNodes []string
		wantEnv   []string
		wantFiles []string // paths the container must see besides its nodes
	}{
		{
			name:      "one GPU",
			device:    node.device(t, "gpu-4"),
			wantNodes: append([]string{"/dev/nvidia4"}, control...),
			wantEnv:   []string{"NVIDIA_VISIBLE_DEVICES=void"},
		},
		{
			name:   "MIG device",
			device: mig,
			wantNodes: append([]string{
				"/dev/nvidia-caps/nvidia-cap" + fmt.Sprint(mig.MIG.GICapMinor),
				"/dev/nvidia-caps/nvidia-cap" + fmt.Sprint(mig.MIG.CICapMinor),
				"/dev/nvidia1",
			}, control...),
			wantEnv: []string{"NVIDIA_VISIBLE_DEVICES=void"},
		},
		{
			name:      "MPS share",
			device:    node.device(t, "gpu-5"),
			edits:     mps.Daemon{Dirs: mpsDirs}.ContainerEdits(),
			wantNodes: append([]string{"/dev/nvidia5"}, control...),
			wantEnv: []string{
				"NVIDIA_VISIBLE_DEVICES=void",
				mps.EnvPipeDirectory + "=" + mps.ContainerPipeDir,
				mps.EnvLogDirectory + "=" + mps.ContainerLogDir,
			},
			wantFiles: []string{mps.ContainerPipeDir + "/control"},
		},
	}
	cri := dial(t, rt.Endpoint())
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			claimUID := fmt.Sprintf("0000000%d-1111-2222-3333-444444444444", i)
			spec, err := cdi.BuildSpec(cdi.SpecInput{
				DriverName: driverName,
				ClaimUID:   claimUID,
				Majors:     node.inv.Majors,
				Devices:    []cdi.SpecDevice{{Device: tc.device, Edits: tc.edits}},
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := writer.Write(claimUID, spec); err != nil {
				t.Fatal(err)
			}
			id := cdi.DeviceID(driverName, claimUID, tc.device.Name())
			script := "find /dev -type c -name 'nvidia*' | sed 's/^/node /'; env | sed 's/^/env /'"
			for _, f := range tc.wantFiles {
				script += fmt.Sprintf("; test -e %s && echo file %s", f, f)
			}
			out := runContainer(t, ctx, cri, fmt.Sprintf("pod-%d", i), filepath.Join(dir, "logs"), id, script)

			var gotNodes, gotEnv, gotFiles []string
			for _, line := range out {
				kind, rest, _ := strings.Cut(line, " ")
				switch kind {
				case "node":
					gotNodes = append(gotNodes, rest)
				case "env":
					gotEnv = append(gotEnv, rest)
				case "file":
					gotFiles = append(gotFiles, rest)
				}
			}
			slices.Sort(gotNodes)
			want := slices.Sorted(slices.Values(tc.wantNodes))
			if !slices.Equal(gotNodes, want) {
				t.Errorf("container's device nodes:\n%s\nwant:\n%s", strings.Join(gotNodes, "\n"), strings.Join(want, "\n"))
			}
			for _, n := range allGPUNodes {
				if slices.Contains(gotNodes, n) != slices.Contains(want, n) {
					t.Errorf("container sees %s: %v, want %v", n, slices.Contains(gotNodes, n), slices.Contains(want, n))
				}
			}
			for _, e := range tc.wantEnv {
				if !slices.Contains(gotEnv, e) {
					t.Errorf("container's environment lacks %s; it has %q", e, gotEnv)
				}
			}
			if !slices.Equal(gotFiles, tc.wantFiles) {
				t.Errorf("container sees files %q, want %q", gotFiles, tc.wantFiles)
			}
		})
	}
}

// simNode is the simulated DGX A100 with MIG devices on GPU 1.
type simNode struct {
	inv   *hardware.Inventory
	model *devicemodel.Model
}

func loadNode(t *testing.T) simNode {
	t.Helper()
	f, err := sim.Load("dgx-a100-mig")
	if err != nil {
		t.Fatal(err)
	}
	n, err := f.Node("dgx-a100-0")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := n.Hardware().Discover(context.Background())
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

func dial(t *testing.T, endpoint string) runtimeapi.RuntimeServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return runtimeapi.NewRuntimeServiceClient(conn)
}

// runContainer runs a pod sandbox with one busybox container that runs
// script with the CDI device id, waits for it to exit 0, and returns its
// output lines (from its CRI log).
func runContainer(t *testing.T, ctx context.Context, cri runtimeapi.RuntimeServiceClient, pod, logRoot, id, script string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	logDir := filepath.Join(logRoot, pod)
	sandboxCfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: pod, Namespace: "default", Uid: pod + "-uid"},
		LogDirectory: logDir,
		Linux:        &runtimeapi.LinuxPodSandboxConfig{},
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
	// The pod network: an address from the node's pod CIDR (the
	// default, 10.88.0.0/24), given by the bridge and host-local plugins.
	if ip := net.ParseIP(st.GetStatus().GetNetwork().GetIp()); ip == nil || !podCIDR.Contains(ip) {
		t.Fatalf("pod IP %q, want one in %s", st.GetStatus().GetNetwork().GetIp(), podCIDR)
	}
	c, err := cri.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId:  sb.PodSandboxId,
		SandboxConfig: sandboxCfg,
		Config: &runtimeapi.ContainerConfig{
			Metadata:   &runtimeapi.ContainerMetadata{Name: "show"},
			Image:      &runtimeapi.ImageSpec{Image: containerruntime.TestImage},
			Command:    []string{"/bin/sh", "-c", script},
			LogPath:    "show.log",
			CDIDevices: []*runtimeapi.CDIDevice{{Name: id}},
			Linux:      &runtimeapi.LinuxContainerConfig{},
		},
	})
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
			lines := readCRILog(t, filepath.Join(logDir, "show.log"))
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
