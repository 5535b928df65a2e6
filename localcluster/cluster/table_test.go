package cluster

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/localcluster/manifests"
	"github.com/gpudra/gpudra/localcluster/realnode/probe"
	"github.com/gpudra/gpudra/localcluster/simnode"
)

// tableReport is a report like the demo's: MIG devices with long CDI IDs,
// an MPS claim with caps, a time-sliced GPU, an unschedulable pod with the
// scheduler's long message, a workload no controller runs, a refused
// object, and names too long for their columns.
func tableReport() *Report {
	const claimUID = "80b4e677-b963-48d9-9464-ceac601830b7"
	mig := PodReport{Namespace: "allocation-mode-all", Name: "pod", Phase: "Running", Node: "dgx-a100-0"}
	migCtr := ContainerReport{Name: "training-job", Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": "void"}}
	var results []DeviceResult
	for i := range 7 {
		dev := fmt.Sprintf("gpu-0-mig-1g5gb-19-%d", i)
		results = append(results, DeviceResult{Request: "mig", Driver: "gpu.nvidia.com", Pool: "dgx-a100-0", Device: dev})
		migCtr.CDIDevices = append(migCtr.CDIDevices, "k8s.gpu.nvidia.com/claim="+claimUID+"-"+dev)
		migCtr.DeviceNodes = append(migCtr.DeviceNodes, fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", 12+2*i), fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", 13+2*i))
	}
	migCtr.DeviceNodes = append(migCtr.DeviceNodes, "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl")
	// The health of the last MIG device, named by its CDI ID in
	// parentheses: too long to follow the label on one line. And a NIC's,
	// whose driver reports none.
	migCtr.AllocatedResourcesStatus = []corev1.ResourceStatus{
		{Name: "claim:pod-mig-x7k2p/mig", Resources: []corev1.ResourceHealth{{ResourceID: corev1.ResourceID(migCtr.CDIDevices[6]), Health: corev1.ResourceHealthStatusHealthy}}},
		{Name: "claim:nic/nic", Resources: []corev1.ResourceHealth{{ResourceID: "nic.sim.gpudra.io/nic=nic-0", Health: corev1.ResourceHealthStatusUnknown}}},
	}
	mig.Claims = []ClaimReport{{Name: "pod-mig-x7k2p", Results: results}}
	mig.Containers = []ContainerReport{migCtr}

	mpsCtr := func(name string) ContainerReport {
		return ContainerReport{
			Name:        name,
			CDIDevices:  []string{"k8s.gpu.nvidia.com/claim=711cadcc-e8ae-4f87-9f20-a3787daed2b6-gpu-5"},
			DeviceNodes: []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia5", "/dev/nvidiactl"},
			Env: map[string]string{"CUDA_MPS_LOG_DIRECTORY": "/var/log/nvidia-mps", "CUDA_MPS_PIPE_DIRECTORY": "/tmp/nvidia-mps",
				"NVIDIA_VISIBLE_DEVICES": "void"},
			Mounts: []string{"/tmp/nvidia-mps", "/dev/shm", "/var/log/nvidia-mps"},
			MPS: []simnode.MPSDaemon{{ID: "711cadcc-e8ae-4f87-9f20-a3787daed2b6", Devices: []string{"GPU-5a1b2c3d-0000-1111-2222-333344445555"},
				ActiveThreadPercentage: ptr.To(25), PinnedMemoryLimits: map[string]int64{"GPU-5a1b2c3d-0000-1111-2222-333344445555": 20 << 30}}},
		}
	}
	mpsPod := PodReport{Namespace: "mps-sharing", Name: "pod", Phase: "Running", Node: "dgx-a100-0",
		Claims:     []ClaimReport{{Name: "mps-gpu", Results: []DeviceResult{{Request: "gpu", Device: "gpu-5"}}}},
		Containers: []ContainerReport{mpsCtr("trainer"), mpsCtr("evaluator"), {Name: "sidecar"}}}

	sliced := PodReport{Namespace: "time-slicing", Name: "pod", Phase: "Running", Node: "dgx-h100-0",
		Claims: []ClaimReport{{Name: "sliced", Results: []DeviceResult{{Request: "gpu", Device: "gpu-3"}}}},
		Containers: []ContainerReport{{Name: "a-container-with-a-long-name",
			CDIDevices:  []string{"k8s.gpu.nvidia.com/claim=0c9e0f7e-5d4e-4b6a-9a51-3d0d1f0a9b11-gpu-3"},
			DeviceNodes: []string{"/dev/nvidia3", "/dev/nvidiactl"},
			TimeSlices:  []simnode.TimeSlice{{Device: "gpu-3", GPU: "GPU-3a1b2c3d-0000-1111-2222-333344445555", Interval: "Long"}}}}}

	const reason = "0/3 nodes are available: 3 cannot allocate all claims. still not schedulable, preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
	pending := PodReport{Namespace: "a-namespace-with-quite-a-long-name", Name: "and-a-long-pod-name-too", Phase: "Pending", Reason: reason}

	// A real node's probe pod: what its container printed.
	probePod := PodReport{Namespace: "real-node", Name: "probe-dgx-a100-0", Phase: "Running", Node: "dgx-a100-0",
		Claims: []ClaimReport{{Name: "probe-gpu", Results: []DeviceResult{{Request: "gpu", Device: "gpu-4"}}}},
		Containers: []ContainerReport{{Name: "probe", Seen: &probe.Seen{
			DeviceNodes: []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia4", "/dev/nvidiactl"},
			Env:         map[string]string{"NVIDIA_VISIBLE_DEVICES": "void", "PATH": "/bin", "HOSTNAME": "probe-dgx-a100-0"},
		}}}}

	return &Report{
		Pods: []PodReport{mig, mpsPod, sliced, pending, probePod},
		Workloads: []WorkloadReport{
			{Kind: "Deployment", Namespace: "default", Name: "web", Desired: 3, Pods: 3, Settled: true},
			{Kind: "DaemonSet", Namespace: "default", Name: "agent", Settled: true, Unsupported: true,
				Message: "unsupported: the local cluster runs no daemonset controller, so nothing makes its pods"},
		},
		Refused: []manifests.Refusal{{Kind: "Pod", Namespace: "missing", Name: "pod", Source: "manifests/bad.yaml:1", Reason: `namespaces "missing" not found`}},
		ComputeDomains: []ComputeDomainReport{
			{Namespace: "compute-domain", Name: "nvl-domain", Status: "Ready", Channel: 0, NumNodes: 4, Nodes: []string{"gb200-0", "gb200-1", "gb200-2", "gb200-3"}},
			{Namespace: "other", Name: "new-domain", Channel: -1},
			{Namespace: "other", Name: "waiting", Status: "NotReady", Channel: 1, NumNodes: 2, Nodes: []string{"gb200-0"}, Reason: "1 of 2 nodes ready"},
		},
	}
}

func TestWriteTable(t *testing.T) {
	var b strings.Builder
	tableReport().WriteTable(&b)
	out := b.String()
	t.Logf("\n%s", out)
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for i, l := range lines {
		if n := len([]rune(l)); n > tableWidth {
			t.Errorf("line %d is %d columns wide, more than %d: %q", i+1, n, tableWidth, l)
		}
	}
	// Every word of the scheduler's message is there, in order, over more
	// than one line.
	flat := strings.Join(strings.Fields(out), " ")
	reason := "reason: 0/3 nodes are available: 3 cannot allocate all claims. still not schedulable, preemption: 0/3 nodes are available: 3 Preemption is not helpful for scheduling."
	if !strings.Contains(flat, reason) {
		t.Errorf("the reason is not there whole")
	}
	reasonLines := 0
	for _, l := range lines {
		if strings.Contains(l, "reason:") || strings.HasPrefix(l, strings.Repeat(" ", len("  reason: "))) && strings.Contains(l, "scheduling.") {
			reasonLines++
		}
	}
	if reasonLines < 2 {
		t.Errorf("the reason takes %d lines, want it wrapped over 2 or more", reasonLines)
	}
	for _, want := range []string{
		"k8s.gpu.nvidia.com/claim=80b4e677-b963-48d9-9464-ceac601830b7-gpu-0-mig-1g5gb-19-6", // the longest CDI ID, whole
		"/dev/nvidia-caps/nvidia-cap25", // a MIG capability node
		"/dev/nvidia5",
		"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
		"GPU-5a1b2c3d-0000-1111-2222-333344445555: active threads 25%, pinned memory 20480 MiB",
		"gpu-3 (GPU-3a1b2c3d-0000-1111-2222-333344445555): Long",
		"a-namespace-with-quite-a-long-name/and-a-long-pod-name-too",
		"Deployment default/web",
		"unsupported: the local cluster runs no daemonset controller",
		`Pod missing/pod (manifests/bad.yaml:1) namespaces "missing" not found`,
		"compute-domain/nvl-domain Ready 0 4 of 4: gb200-0 gb200-1 gb200-2 gb200-3",
		"other/new-domain - - 0:",
		"probe saw /dev/nvidia-uvm /dev/nvidia-uvm-tools /dev/nvidia4 /dev/nvidiactl saw NVIDIA_VISIBLE_DEVICES=void",
		"health claim:pod-mig-x7k2p/mig=Healthy (k8s.gpu.nvidia.com/claim=80b4e677-b963-48d9-9464-ceac601830b7-gpu-0-mig-1g5gb-19-6)", // whole, not cut
		"claim:nic/nic=Unknown (not reported) (nic.sim.gpudra.io/nic=nic-0)",
		"other/waiting NotReady 1 1 of 2: gb200-0 reason: 1 of 2 nodes ready",
	} {
		if !strings.Contains(flat, want) {
			t.Errorf("the table does not show %q", want)
		}
	}
	// Each of the pod's rows starts at the left margin with its name, and
	// its containers' rows under it name the container once.
	if !strings.HasPrefix(lines[1], "allocation-mode-all/pod ") {
		t.Errorf("first pod row %q", lines[1])
	}
	if got := strings.Count(out, "  trainer  "); got != 1 {
		t.Errorf("container trainer named %d times, want once", got)
	}
	if strings.Contains(out, "sidecar") {
		t.Errorf("a container without devices has rows")
	}
	if strings.Contains(out, "HOSTNAME") {
		t.Errorf("a real node's container's rows show more of its environment than NVIDIA's and CUDA's variables")
	}
}

func TestWrapCutsOverlongWords(t *testing.T) {
	var b strings.Builder
	tb := &table{w: &b}
	long := strings.Repeat("x", 250)
	tb.wrap("  label  ", "", []string{"short", long, "end"})
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	total := 0
	for _, l := range lines {
		if len(l) > tableWidth {
			t.Errorf("line of %d columns: %q", len(l), l)
		}
		total += strings.Count(l, "x")
	}
	if total != 250 || !strings.HasSuffix(lines[len(lines)-1], "end") || !strings.HasPrefix(lines[0], "  label  short") {
		t.Errorf("wrapped into %q; want every x kept, the words in order", lines)
	}
}
