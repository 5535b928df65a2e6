package controlplane

import (
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// TestLogsOfAKubeletOnLoopback: a real node's kubelet serves its API on
// 127.0.0.1 with the certificate of WriteKubeletServingCert, and reports
// the machine's address as the Node's InternalIP (it refuses a loopback
// one). kubectl logs of its pod reaches it: it once failed to connect to
// the machine's address, where nothing listens.
func TestLogsOfAKubeletOnLoopback(t *testing.T) {
	ips := machineIPs()
	if len(ips) == 0 {
		t.Skip("this machine has no address but loopback")
	}
	_, ctx := ktesting.NewTestContext(t)
	cp, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cp.Stop(); err != nil {
			t.Error(err)
		}
	}()
	dir := t.TempDir()
	cert, key := filepath.Join(dir, "k.crt"), filepath.Join(dir, "k.key")
	if err := cp.WriteKubeletServingCert("node-a", cert, key); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/default/p/ctr", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("hello from the kubelet\n"))
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.ServeTLS(ln, cert, key) }()
	defer srv.Close()

	client := kubernetes.NewForConfigOrDie(cp.RESTConfig("test", 10, 20))
	node, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ips[0].String()}, {Type: corev1.NodeHostName, Address: "node-a"}}
	node.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(ln.Addr().(*net.TCPAddr).Port)
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "p"},
		Spec:       corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "ctr", Image: "busybox"}}},
	}
	// Refused until the controller has made the default ServiceAccount.
	err = clustertest.Poll(ctx, time.Minute, func() bool {
		_, err := client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
		return err == nil
	})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
	out, err := client.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "ctr"}).DoRaw(ctx)
	if err != nil || string(out) != "hello from the kubelet\n" {
		t.Errorf("logs of the pod on node-a (InternalIP %s): %q, %v; want the kubelet's answer", ips[0], out, err)
	}
}
