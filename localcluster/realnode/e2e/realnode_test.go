package e2e

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/api/resource/v1beta1"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/realnode/probe"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// fleet is the real node's fleet: one DGX A100, GPUs 0-3 in MIG mode with
// MIG devices, GPUs 4-7 whole.
const fleet = "dgx-a100-mig"

// TestRealNode runs busybox containers with gpudra's claims on a real
// node and checks what they saw, then restarts the kubelet and gpudra's
// container under a running pod:
//   - a one-GPU claim: exactly its GPU's node, the control nodes, and
//     the environment of the claim's CDI spec; deleting the pod
//     unprepares the claim (CDI spec and checkpoint entry gone);
//   - a MIG claim: its GPU's node and its two MIG capability nodes;
//   - an MPS claim (examples/mps-sharing's): the MPS daemon's pipe
//     directory, and the nodes of its CDI spec;
//   - after a kubelet restart and a restart of gpudra's container, the
//     running pod keeps its devices, a new pod gets a different GPU, and
//     deleting pods unprepares their claims.
func TestRealNode(t *testing.T) {
	c, ctx := startCluster(t, fleet)
	rn := c.RealNodes()[0]
	// What the test does with the node that any node does (CDI specs,
	// checkpoint, plugin restart), it does through cluster.Node.
	n := c.Node(rn.Name())
	if n == nil || !n.Real() {
		t.Fatalf("cluster.Node(%s) = %v, want the real node", rn.Name(), n)
	}
	driver := c.Options().DriverName
	client := c.Client()
	const ns = metav1.NamespaceDefault
	gpu := clustertest.ClaimTemplate(ns, "one-gpu", clustertest.Spec(clustertest.Request("dev", "gpu.nvidia.com")))

	t.Run("one GPU", func(t *testing.T) {
		pod, claim, seen := runProbe(t, ctx, c, gpu, "one-gpu")
		checkGPUClaim(t, n, claim, seen)
		attrs := checkMetadata(t, c, seen, claim)
		for _, name := range []string{"uuid", "productName", "index", "minor"} {
			if _, ok := attrs[resourceapi.QualifiedName(name)]; !ok {
				t.Errorf("GPU metadata lacks %s: %v", name, attrs)
			}
		}
		// kubectl logs: kube-apiserver reaches the kubelet's API, which
		// listens on loopback, and the kubelet reads the same file.
		want, err := n.ContainerLog(pod, "ctr")
		if err != nil {
			t.Fatal(err)
		}
		// Both go through kube-apiserver to the kubelet (and, for exec, to
		// containerd's streaming server): each attempt that fails is
		// logged, and the check fails only if none succeeds in 20 s.
		eventually(t, ctx, "logs through the API server", func() error {
			got, err := client.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "ctr"}).DoRaw(ctx)
			if err != nil || string(got) != want {
				return fmt.Errorf("%q, %v; want what the container wrote, %q", got, err, want)
			}
			return nil
		})
		// kubectl exec, over WebSocket as kubectl does: the container's
		// busybox answers.
		execURL := client.CoreV1().RESTClient().Post().Namespace(pod.Namespace).Resource("pods").Name(pod.Name).SubResource("exec").
			VersionedParams(&corev1.PodExecOptions{Container: "ctr", Command: []string{"echo", "exec works"}, Stdout: true, Stderr: true}, scheme.ParameterCodec).URL()
		eventually(t, ctx, "exec through the API server", func() error {
			exec, err := remotecommand.NewWebSocketExecutor(c.ControlPlane().RESTConfig("realnode-e2e", 10, 20), "GET", execURL.String())
			if err != nil {
				return err
			}
			var stdout, stderr bytes.Buffer
			if err := exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr}); err != nil || stdout.String() != "exec works\n" {
				return fmt.Errorf("stdout %q, stderr %q, %v; want the container's echo", stdout.String(), stderr.String(), err)
			}
			return nil
		})
		deletePod(t, ctx, c, pod)
		clustertest.Eventually(t, ctx, 2*time.Minute, "claim unprepared", func() bool {
			return len(specFiles(t, n, claim)) == 0 && !checkpointHas(t, n, claim)
		})
	})

	t.Run("MIG", func(t *testing.T) {
		tmpl := clustertest.ClaimTemplate(ns, "mig", clustertest.Spec(clustertest.Request("dev", "mig.nvidia.com", "device.attributes['gpu.nvidia.com'].profile == '1g.5gb'")))
		pod, claim, seen := runProbe(t, ctx, c, tmpl, "mig")
		dev := claim.Status.Allocation.Devices.Results[0].Device
		// gpu-<minor>-mig-<profile>-<gi>-<start>
		parts := strings.Split(dev, "-")
		if len(parts) < 4 || parts[0] != "gpu" || parts[2] != "mig" {
			t.Fatalf("allocated %s: not a MIG device name", dev)
		}
		var caps []string
		for _, d := range seen.DeviceNodes {
			if strings.HasPrefix(d, "/dev/nvidia-caps/") {
				caps = append(caps, d)
			}
		}
		if got := gpuNodes(seen); len(got) != 1 || got[0] != "/dev/nvidia"+parts[1] {
			t.Errorf("MIG device %s: GPU nodes %v, want /dev/nvidia%s only", dev, got, parts[1])
		}
		if len(caps) != 2 {
			t.Errorf("MIG device %s: capability nodes %v, want its GI's and CI's", dev, caps)
		}
		if want := specDeviceNodes(t, n, claim); !sameSet(seen.DeviceNodes, want) {
			t.Errorf("MIG device %s: the container saw %v, the claim's CDI spec names %v", dev, seen.DeviceNodes, want)
		}
		attrs := checkMetadata(t, c, seen, claim)
		for _, name := range []string{"uuid", "parentUUID", "profile"} {
			if a, ok := attrs[resourceapi.QualifiedName(name)]; !ok || a.StringValue == nil || *a.StringValue == "" {
				t.Errorf("MIG metadata: %s is %+v, want a value: %v", name, a, attrs)
			}
		}
		deletePod(t, ctx, c, pod)
	})

	t.Run("MPS", func(t *testing.T) {
		// examples/mps-sharing's claim, as a template.
		spec := clustertest.Spec(clustertest.Request("dev", "gpu.nvidia.com"))
		mps := v1beta1.DefaultGpuConfig()
		mps.Sharing = &v1beta1.GpuSharing{Strategy: v1beta1.MpsStrategy, MpsConfig: &v1beta1.MpsConfig{
			DefaultActiveThreadPercentage: ptr.To(50), DefaultPinnedDeviceMemoryLimit: ptr.To(resource.MustParse("10Gi")),
		}}
		spec.Devices.Config = append(spec.Devices.Config, clustertest.Config(t, driver, mps, "dev"))
		tmpl := clustertest.ClaimTemplate(ns, "mps", spec)
		pod, claim, seen := runProbe(t, ctx, c, tmpl, "mps")
		if seen.MPSPipeDirectory == "" {
			t.Errorf("MPS claim: the container has no MPS pipe directory (CUDA_MPS_PIPE_DIRECTORY=%q)", seen.Env["CUDA_MPS_PIPE_DIRECTORY"])
		}
		if want := specDeviceNodes(t, n, claim); !sameSet(seen.DeviceNodes, want) {
			t.Errorf("MPS claim: the container saw %v, the claim's CDI spec names %v", seen.DeviceNodes, want)
		}
		attrs := checkMetadata(t, c, seen, claim)
		if a := attrs["mpsPipeDirectory"]; a.StringValue == nil || *a.StringValue == "" {
			t.Errorf("MPS metadata: mpsPipeDirectory is %+v, want the daemon's: %v", a, attrs)
		}
		deletePod(t, ctx, c, pod)
		clustertest.Eventually(t, ctx, 2*time.Minute, "MPS claim unprepared", func() bool {
			return len(specFiles(t, n, claim)) == 0 && !checkpointHas(t, n, claim)
		})
	})

	t.Run("restarts lose nothing", func(t *testing.T) {
		first, firstClaim, _ := runProbe(t, ctx, c, gpu, "keeps")
		ctrID := containerID(first)

		if err := rn.RestartKubelet(ctx, client); err != nil {
			t.Fatal(err)
		}
		if err := n.RestartPlugin(ctx); err != nil {
			t.Fatal(err)
		}

		// The running pod keeps its container (same ID, no restart) and
		// its claim stays prepared.
		p, err := client.CoreV1().Pods(ns).Get(ctx, first.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.Phase != corev1.PodRunning || containerID(p) != ctrID {
			t.Errorf("after the restarts pod %s is %s with container %s, want Running with %s", p.Name, p.Status.Phase, containerID(p), ctrID)
		}
		if len(specFiles(t, n, firstClaim)) == 0 || !checkpointHas(t, n, firstClaim) {
			t.Errorf("after the restarts claim %s lost its CDI spec or checkpoint entry", firstClaim.Name)
		}
		// A new pod gets another GPU, and sees only that one.
		second, secondClaim, seen := runProbe(t, ctx, c, gpu, "after-restart")
		checkGPUClaim(t, n, secondClaim, seen)
		if a, b := firstClaim.Status.Allocation.Devices.Results[0].Device, secondClaim.Status.Allocation.Devices.Results[0].Device; a == b {
			t.Errorf("both pods got %s", a)
		}
		// Unprepare after the restarts.
		for _, pc := range []struct {
			pod   *corev1.Pod
			claim *resourceapi.ResourceClaim
		}{{first, firstClaim}, {second, secondClaim}} {
			deletePod(t, ctx, c, pc.pod)
			clustertest.Eventually(t, ctx, 2*time.Minute, "claim "+pc.claim.Name+" unprepared", func() bool {
				return len(specFiles(t, n, pc.claim)) == 0 && !checkpointHas(t, n, pc.claim)
			})
		}
	})
}

// checkGPUClaim checks what a container with a one-GPU claim saw: its
// GPU's node and the control nodes, nothing else, and every variable of
// the claim's CDI spec.
func checkGPUClaim(t *testing.T, n cluster.Node, claim *resourceapi.ResourceClaim, seen *probe.Seen) {
	t.Helper()
	dev := claim.Status.Allocation.Devices.Results[0].Device
	minor, ok := strings.CutPrefix(dev, "gpu-")
	if _, err := strconv.Atoi(minor); !ok || err != nil {
		t.Fatalf("allocated %s: not a whole GPU", dev)
	}
	want := append([]string{"/dev/nvidia" + minor}, controlNodes...)
	if !sameSet(seen.DeviceNodes, want) {
		t.Errorf("claim of %s: the container saw %v, want exactly %v", dev, seen.DeviceNodes, want)
	}
	env := specEnv(t, n, claim)
	if len(env) == 0 {
		t.Fatalf("claim of %s: its CDI spec sets no environment", dev)
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if got, ok := seen.Env[k]; !ok || got != v {
			t.Errorf("claim of %s: the container has %s=%q (set: %v), the CDI spec sets %q", dev, k, got, ok, v)
		}
	}
}

// specs reads the claim's CDI specs.
func specs(t *testing.T, n cluster.Node, claim *resourceapi.ResourceClaim) []cdispec.Spec {
	t.Helper()
	files := specFiles(t, n, claim)
	if len(files) == 0 {
		t.Fatalf("claim %s has no CDI spec in %s", claim.Name, n.CDIDir())
	}
	var out []cdispec.Spec
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var s cdispec.Spec
		if err := yaml.Unmarshal(b, &s); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out = append(out, s)
	}
	return out
}

// specEnv returns the environment the claim's CDI specs set.
func specEnv(t *testing.T, n cluster.Node, claim *resourceapi.ResourceClaim) []string {
	var env []string
	for _, s := range specs(t, n, claim) {
		env = append(env, s.ContainerEdits.Env...)
		for _, d := range s.Devices {
			env = append(env, d.ContainerEdits.Env...)
		}
	}
	return env
}

// specDeviceNodes returns the device nodes the claim's CDI specs name.
func specDeviceNodes(t *testing.T, n cluster.Node, claim *resourceapi.ResourceClaim) []string {
	var out []string
	for _, s := range specs(t, n, claim) {
		for _, d := range s.ContainerEdits.DeviceNodes {
			out = append(out, d.Path)
		}
		for _, dev := range s.Devices {
			for _, d := range dev.ContainerEdits.DeviceNodes {
				out = append(out, d.Path)
			}
		}
	}
	return out
}

// containerID returns the pod's one container's ID.
func containerID(p *corev1.Pod) string {
	if len(p.Status.ContainerStatuses) != 1 {
		return ""
	}
	return p.Status.ContainerStatuses[0].ContainerID
}
