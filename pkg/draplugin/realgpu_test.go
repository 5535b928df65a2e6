package draplugin_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/internal/shorttemp"
	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/nvmlhw"
	"github.com/gpudra/gpudra/pkg/mps"
)

// TestRealGPU runs the plugin on this machine's GPUs through NVML, as on a
// GPU node, against a fake API server: discovery and the published
// slices, a full-GPU claim prepared and unprepared with the driver's
// files in its CDI spec, an MPS claim whose daemon really starts, caps
// memory and stops, and the health watcher on real NVML events. It
// changes no MIG mode, compute mode, clock or time slice. Without the
// NVIDIA driver it is skipped; GPUDRA_REQUIRE_GPU=1 makes that a failure.
//
// Optional environment: GPUDRA_DRIVER_ROOT (default /);
// GPUDRA_REAL_GPU_OUT, a directory that gets the slices and CDI specs;
// GPUDRA_REAL_GPU_PYTHON, a python3 with torch, to run a CUDA program with
// each claim's environment (under MPS: within and beyond its memory cap).
func TestRealGPU(t *testing.T) {
	root := os.Getenv("GPUDRA_DRIVER_ROOT")
	if root == "" {
		root = "/"
	}
	hw := nvmlhw.NewReal(nvmlhw.WithDriverRoot(root))
	inv, err := hw.Discover(context.Background())
	if err == nil && len(inv.GPUs) == 0 {
		err = errors.New("NVML lists no GPU")
	}
	if err != nil {
		if os.Getenv("GPUDRA_REQUIRE_GPU") != "" {
			t.Fatalf("GPUDRA_REQUIRE_GPU set but: %v", err)
		}
		t.Skipf("no usable NVIDIA GPU here: %v", err)
	}
	out := os.Getenv("GPUDRA_REAL_GPU_OUT")
	save := func(name string, data []byte) {
		if out != "" {
			if err := os.WriteFile(filepath.Join(out, name), data, 0o644); err != nil {
				t.Error(err)
			}
		}
	}
	var mpsManager *mps.Manager
	mpsRoot := filepath.Join(shorttemp.Dir(t), "mps")
	if bin, err := exec.LookPath(mps.DefaultControlBinary); err == nil {
		if mpsManager, err = mps.New(mpsRoot, mps.WithControlBinary(bin)); err != nil {
			t.Fatal(err)
		}
	} else {
		t.Logf("no %s in PATH: the MPS claim is skipped", mps.DefaultControlBinary)
	}
	h := newHarness(t, func(cfg *draplugin.Config) {
		cfg.Hardware = hw
		cfg.NodeName = "gpu-node"
		cfg.MIGMode = draplugin.MIGModeStatic
		cfg.MPS = mpsManager
		cfg.DriverEdits = cdi.NewNVCDIEdits(cdi.NVCDIOptions{DriverRoot: root})
	})

	// Discovery and publication: one device per GPU (no VFIO, static MIG
	// on GPUs without MIG mode), with NVIDIA's attributes.
	want := 0
	for _, g := range inv.GPUs {
		t.Logf("GPU %d minor %d %s %q arch %s cc %s, %d MiB, bus %s, root %q, NUMA %v, MIG capable %v enabled %v",
			g.Index, g.Minor, g.UUID, g.ProductName, g.Architecture, g.CUDAComputeCapability, g.MemoryBytes>>20,
			g.PCIBusID, g.PCIeRoot, numa(g.NUMANode), g.MIGCapable, g.MIGEnabled)
		want++
		want += len(g.MIGDevices)
		if g.MIGEnabled {
			want-- // a GPU in MIG mode publishes its MIG devices, not itself
		}
	}
	h.waitForPublished(t, want)
	slices, err := h.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data, err := yaml.Marshal(slices)
	if err != nil {
		t.Fatal(err)
	}
	save("resourceslices.yaml", data)
	gpu := inv.GPUs[0]
	name := "gpu-" + itoa(gpu.Minor)
	var dev *resourceapi.Device
	for i := range slices.Items[0].Spec.Devices {
		if d := &slices.Items[0].Spec.Devices[i]; d.Name == name {
			dev = d
		}
	}
	if dev == nil {
		t.Fatalf("no device %s published", name)
	}
	for _, attr := range []resourceapi.QualifiedName{"type", "uuid", "productName", "brand", "architecture", "cudaComputeCapability", "driverVersion", "cudaDriverVersion", "resource.kubernetes.io/pciBusID"} {
		if _, ok := dev.Attributes[attr]; !ok {
			t.Errorf("%s lacks attribute %s", name, attr)
		}
	}
	if got := *dev.Attributes["uuid"].StringValue; got != gpu.UUID {
		t.Errorf("%s has uuid %s, want %s", name, got, gpu.UUID)
	}
	if len(dev.Taints) != 0 {
		t.Errorf("a healthy GPU is tainted: %v", dev.Taints)
	}

	// A full-GPU claim: its device node, the control nodes and the
	// driver's files through CDI.
	full := h.claim(name)
	start := time.Now()
	r := h.mustPrepare(full)
	t.Logf("Prepare of %s: %v, CDI IDs %v", name, time.Since(start), r.Devices[0].CdiDeviceIds)
	spec := readSpec(t, h, full)
	save("cdi-full-gpu.json", mustJSON(t, spec))
	nodes := map[string]bool{}
	for _, d := range spec.Devices {
		for _, n := range d.ContainerEdits.DeviceNodes {
			nodes[n.Path] = true
		}
	}
	for _, n := range spec.ContainerEdits.DeviceNodes {
		nodes[n.Path] = true
	}
	for _, p := range []string{"/dev/nvidia" + itoa(gpu.Minor), "/dev/nvidiactl", "/dev/nvidia-uvm"} {
		if !nodes[p] {
			t.Errorf("CDI spec lacks device node %s: has %v", p, nodes)
		}
	}
	for p := range nodes {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("CDI spec names %s, which this node lacks: %v", p, err)
		}
	}
	mounts := 0
	for _, m := range spec.ContainerEdits.Mounts {
		if strings.Contains(m.HostPath, "libnvidia-ml.so") || strings.Contains(m.HostPath, "libcuda.so") {
			mounts++
		}
	}
	if mounts < 2 {
		t.Errorf("CDI spec mounts %d of libcuda.so and libnvidia-ml.so, want both", mounts)
	}
	runCUDA(t, spec, 512<<20, true)
	h.mustUnprepare(full)
	if files := h.specFiles(); len(files) != 0 {
		t.Errorf("CDI specs left after Unprepare: %v", files)
	}

	// An MPS claim: a real control daemon with a 4 GiB pinned-memory cap.
	if mpsManager != nil {
		c := h.claim(name)
		withConfig(c, resourceapi.AllocationConfigSourceClaim, nil,
			`{"apiVersion":"resource.nvidia.com/v1beta1","kind":"GpuConfig","sharing":{"strategy":"MPS","mpsConfig":{"defaultActiveThreadPercentage":50,"defaultPinnedDeviceMemoryLimit":"4Gi"}}}`)
		c = h.update(c)
		start := time.Now()
		h.mustPrepare(c)
		t.Logf("Prepare of an MPS claim (daemon started and answering): %v", time.Since(start))
		spec := readSpec(t, h, c)
		save("cdi-mps.json", mustJSON(t, spec))
		dirs := mpsManager.Dirs(string(c.UID))
		if log, err := os.ReadFile(filepath.Join(dirs.Log, "control.log")); err == nil {
			t.Logf("MPS control.log:\n%s", log)
		}
		runCUDA(t, spec, 512<<20, true)
		runCUDA(t, spec, 8<<30, false) // beyond the cap
		if log, err := os.ReadFile(filepath.Join(dirs.Log, "server.log")); err == nil {
			t.Logf("MPS server.log:\n%s", log)
			save("mps-server.log", log)
		}
		start = time.Now()
		h.mustUnprepare(c)
		t.Logf("Unprepare of the MPS claim (daemon stopped): %v", time.Since(start))
		if _, err := os.Stat(dirs.Root); !os.IsNotExist(err) {
			t.Errorf("MPS directory %s left behind: %v", dirs.Root, err)
		}
		if pids := processes(t, "nvidia-cuda-mps"); len(pids) != 0 {
			t.Errorf("MPS processes left after Unprepare: %v", pids)
		}
	}

	// Health: the watcher runs on NVML's event set; a healthy GPU stays
	// untainted over a few polls, and one check reads every GPU.
	conds, err := hw.CheckHealth(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range conds {
		t.Logf("health of GPU %d %s: %s (recovery action %q)", c.Index, c.UUID, c, c.Recovery)
		if !c.Healthy() {
			t.Errorf("GPU %d is not healthy: %+v", c.Index, c)
		}
	}
	time.Sleep(2*nvmlhw.DefaultHealthPollInterval + time.Second)
	slices, err = h.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slices.Items {
		for _, d := range s.Spec.Devices {
			if len(d.Taints) != 0 {
				t.Errorf("%s tainted on a healthy node: %v", d.Name, d.Taints)
			}
		}
	}
	var _ hardware.HealthWatcher = hw
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// readSpec reads the claim's CDI spec.
func readSpec(t *testing.T, h *harness, c *resourceapi.ResourceClaim) *cdispec.Spec {
	t.Helper()
	var spec cdispec.Spec
	if err := yaml.Unmarshal([]byte(h.specContent(c)), &spec); err != nil {
		t.Fatal(err)
	}
	return &spec
}

// runCUDA runs a CUDA program that allocates size bytes on the claim's GPU
// with the environment the claim's CDI spec gives a container (paths a
// mount puts in the container are replaced by their host paths, since it
// runs on the host), and checks that the allocation works or not. Skipped
// without GPUDRA_REAL_GPU_PYTHON.
func runCUDA(t *testing.T, spec *cdispec.Spec, size int64, ok bool) {
	t.Helper()
	python := os.Getenv("GPUDRA_REAL_GPU_PYTHON")
	if python == "" {
		return
	}
	var env []string
	edits := []cdispec.ContainerEdits{spec.ContainerEdits}
	for _, d := range spec.Devices {
		edits = append(edits, d.ContainerEdits)
	}
	hostPath := map[string]string{}
	for _, e := range edits {
		for _, m := range e.Mounts {
			hostPath[m.ContainerPath] = m.HostPath
		}
	}
	for _, e := range edits {
		for _, kv := range e.Env {
			k, v, _ := strings.Cut(kv, "=")
			if p, ok := hostPath[v]; ok && k != "NVIDIA_VISIBLE_DEVICES" {
				v = p
			}
			env = append(env, k+"="+v)
		}
	}
	const program = `
import os, sys, torch
n = int(sys.argv[1])
try:
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    print("allocated", n, "bytes on", torch.cuda.get_device_name(), "sum", int(x[:1024].sum()))
except Exception as e:
    print("refused:", type(e).__name__, str(e).splitlines()[0])
    sys.exit(3)
`
	cmd := exec.Command(python, "-c", program, itoa(int(size)))
	cmd.Env = append(os.Environ(), env...)
	outb, err := cmd.CombinedOutput()
	t.Logf("CUDA program with %v allocating %d MiB: %v\n%s", env, size>>20, err, outb)
	var exit *exec.ExitError
	switch {
	case ok && err != nil:
		t.Errorf("allocating %d MiB failed: %v", size>>20, err)
	case !ok && (!errors.As(err, &exit) || exit.ExitCode() != 3):
		t.Errorf("allocating %d MiB beyond the cap: got %v, want a refused allocation", size>>20, err)
	}
}

// processes lists the pids whose command name starts with prefix, but not
// zombies: a daemon that exited stays one until its parent reaps it.
func processes(t *testing.T, prefix string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, e := range entries {
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		_, rest, _ := strings.Cut(string(stat), ") ")
		if err == nil && strings.HasPrefix(strings.TrimSpace(string(comm)), prefix) && !strings.HasPrefix(rest, "Z") {
			pids = append(pids, e.Name()+":"+strings.TrimSpace(string(comm)))
		}
	}
	return pids
}

func numa(n *int) string {
	if n == nil {
		return "none"
	}
	return itoa(*n)
}
