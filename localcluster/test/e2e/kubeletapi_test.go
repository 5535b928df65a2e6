package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/utils/ptr"
)

// podLogs does the equivalent of `kubectl logs`: GET pods/log, which
// kube-apiserver proxies to the node's kubelet API.
func podLogs(ctx context.Context, ns, pod string, opts *corev1.PodLogOptions) (string, error) {
	data, err := demo.Client().CoreV1().Pods(ns).GetLogs(pod, opts).DoRaw(ctx)
	return string(data), err
}

// podLogsError is the error `kubectl logs` shows: read as a stream, as
// kubectl does, an error response keeps the server's message (DoRaw
// gives a generic one).
func podLogsError(ctx context.Context, ns, pod string, opts *corev1.PodLogOptions) error {
	stream, err := demo.Client().CoreV1().Pods(ns).GetLogs(pod, opts).Stream(ctx)
	if err != nil {
		return err
	}
	defer stream.Close()
	data, _ := io.ReadAll(stream)
	return fmt.Errorf("no error; the logs: %q", data)
}

// TestKubeletAPI: `kubectl logs` of a container on a simulated node tells
// what it was given (CDI devices, device nodes, environment, mounts, MPS
// caps, time slice), reaching the node the way kube-apiserver reaches a
// kubelet (InternalIP, daemon endpoint port, a certificate it verifies);
// exec, attach and port-forward are refused saying that the node runs no
// containers, not with a DNS error.
func TestKubeletAPI(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	applyObjects(t, ctx, demo, loadTestdata(t, "kubelet-api", "mps-claim.yaml", "kubelet-api.yaml"))
	mpsPod := waitForPod(t, ctx, "kubelet-api", "mps", "Running", running)
	slicedPod := waitForPod(t, ctx, "kubelet-api", "sliced", "Running", running)

	node, err := demo.Client().CoreV1().Nodes().Get(ctx, mpsPod.Spec.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	addrs := map[corev1.NodeAddressType]string{}
	for _, a := range node.Status.Addresses {
		addrs[a.Type] = a.Address
	}
	if addrs[corev1.NodeInternalIP] != "127.0.0.1" || addrs[corev1.NodeHostName] != node.Name || node.Status.DaemonEndpoints.KubeletEndpoint.Port <= 0 {
		t.Errorf("node %s: addresses %v, kubelet port %d; want InternalIP 127.0.0.1, Hostname %s and a port",
			node.Name, addrs, node.Status.DaemonEndpoints.KubeletEndpoint.Port, node.Name)
	}

	ctrs, _ := demo.SimNode(mpsPod.Spec.NodeName).Containers(mpsPod)
	devs := devicesOf(t, ctx, mpsPod)
	// The claim's CDI device, and the one of its device metadata
	// (KEP-5304), which mounts the file where the container reads it.
	if len(devs) != 1 || len(ctrs["gpu"].CDIDevices) != 2 || !strings.HasPrefix(ctrs["gpu"].CDIDevices[1], "gpu.nvidia.com/metadata=") {
		t.Fatalf("pod mps: devices %v, container gpu %+v", devs, ctrs["gpu"])
	}
	if metadataFile := "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/mps/gpu/gpu.nvidia.com-metadata.json"; !slices.Contains(ctrs["gpu"].Mounts, metadataFile) {
		t.Errorf("pod mps: container gpu mounts %v, want the device metadata at %s", ctrs["gpu"].Mounts, metadataFile)
	}
	logs, err := podLogs(ctx, "kubelet-api", "mps", &corev1.PodLogOptions{Container: "gpu"})
	if err != nil {
		t.Fatalf("logs of mps/gpu: %v", err)
	}
	t.Logf("logs of mps/gpu:\n%s", logs)
	// The same text through cluster.Node, as a test reads a real node's.
	n := demo.Node(mpsPod.Spec.NodeName)
	if direct, err := n.ContainerLog(mpsPod, "gpu"); err != nil || direct != logs || n.Real() {
		t.Errorf("cluster.Node(%s).ContainerLog: %q, %v (real %v); want what kubectl logs shows", mpsPod.Spec.NodeName, direct, err, n.Real())
	}
	if _, err := n.ContainerLog(mpsPod, "nosuch"); err == nil {
		t.Error("cluster.Node.ContainerLog of a container the pod does not have succeeded")
	}
	for _, want := range []string{
		"CDI device: " + ctrs["gpu"].CDIDevices[0],
		"device node: /dev/nvidia" + attr(devs[0], "minor") + "\n",
		"env: CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps\n",
		"mount: /tmp/nvidia-mps\n",
		attr(devs[0], "uuid") + ": active threads 25%, pinned memory 20480 MiB",
		"request gpu: device gpu.nvidia.com/" + mpsPod.Spec.NodeName + "/" + devs[0].Name,
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs of mps/gpu lack %q", want)
		}
	}
	tail, err := podLogs(ctx, "kubelet-api", "mps", &corev1.PodLogOptions{Container: "gpu", TailLines: ptr.To[int64](1)})
	lines := strings.Split(strings.TrimSuffix(logs, "\n"), "\n")
	if err != nil || tail != lines[len(lines)-1]+"\n" {
		t.Errorf("logs --tail=1: %q, %v; want the last line %q", tail, err, lines[len(lines)-1])
	}
	if err := podLogsError(ctx, "kubelet-api", "mps", &corev1.PodLogOptions{Container: "gpu", Previous: true}); !strings.Contains(err.Error(), `previous terminated container "gpu"`) {
		t.Errorf("logs --previous: %v; want no previous container", err)
	}
	if plain, err := podLogs(ctx, "kubelet-api", "mps", &corev1.PodLogOptions{Container: "plain"}); err != nil || !strings.Contains(plain, "no devices") || strings.Contains(plain, "CDI device") {
		t.Errorf("logs of mps/plain: %q, %v; want no devices", plain, err)
	}

	slicedDevs := devicesOf(t, ctx, slicedPod)
	if len(slicedDevs) != 1 {
		t.Fatalf("pod sliced: devices %v", slicedDevs)
	}
	sliced, err := podLogs(ctx, "kubelet-api", "sliced", &corev1.PodLogOptions{})
	want := "time slice: " + slicedDevs[0].Name + " (" + attr(slicedDevs[0], "uuid") + "): Long\n"
	if err != nil || !strings.Contains(sliced, want) {
		t.Errorf("logs of sliced: %q, %v; want %q", sliced, err, want)
	}

	cfg := demo.ControlPlane().RESTConfig("e2e-kubelet-api", 50, 100)
	execURL := demo.Client().CoreV1().RESTClient().Post().Namespace("kubelet-api").Resource("pods").Name("mps").SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: "gpu", Command: []string{"nvidia-smi"}, Stdout: true, Stderr: true}, scheme.ParameterCodec).URL()
	spdyExec, err := remotecommand.NewSPDYExecutor(cfg, "POST", execURL)
	if err != nil {
		t.Fatal(err)
	}
	wsExec, err := remotecommand.NewWebSocketExecutor(cfg, "GET", execURL.String())
	if err != nil {
		t.Fatal(err)
	}
	for name, exec := range map[string]remotecommand.Executor{"SPDY": spdyExec, "WebSocket": wsExec} {
		var out bytes.Buffer
		err := exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &out})
		if err == nil || !strings.Contains(err.Error(), "runs no containers") || strings.Contains(err.Error(), "no such host") {
			t.Errorf("exec over %s: %v (output %q); want the node's refusal: it runs no containers", name, err, out.String())
		}
	}

	pfURL := demo.Client().CoreV1().RESTClient().Post().Namespace("kubelet-api").Resource("pods").Name("mps").SubResource("portforward").URL()
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, "POST", pfURL)
	conn, _, err := dialer.Dial(portforward.PortForwardProtocolV1Name)
	if err == nil {
		conn.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "port-forward is not available") || !strings.Contains(err.Error(), "runs no containers") {
		t.Errorf("port-forward: %v; want the node's refusal", err)
	}
}
