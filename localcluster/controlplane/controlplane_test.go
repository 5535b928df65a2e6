package controlplane

import (
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// TestStartSchedulesPod starts the control plane, registers a Node and
// checks that the scheduler binds a pod to it and that the kubeconfig
// works; it also checks the directory is gone after Stop.
func TestStartSchedulesPod(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	start := time.Now()
	cp, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("control plane ready in %v", time.Since(start))
	dir := cp.Dir()
	defer func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("directory %s still there after Stop: %v", dir, err)
		}
	}()

	// The written kubeconfig is what users get; test through it.
	cfg, err := clientcmd.BuildConfigFromFlags("", cp.KubeconfigPath())
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}
	node, err = client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(node.Spec.Taints) != 0 {
		t.Errorf("new node has taints %v; TaintNodesByCondition should be off", node.Spec.Taints)
	}
	capacity := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("10")}
	node.Status = corev1.NodeStatus{Capacity: capacity, Allocatable: capacity,
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	if _, err := client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err = clustertest.Poll(ctx, 30*time.Second, func() bool {
		p, err := client.CoreV1().Pods("default").Get(ctx, "p", metav1.GetOptions{})
		return err == nil && p.Spec.NodeName == "n1"
	})
	if err != nil {
		t.Fatalf("pod not bound to n1: %v", err)
	}

	// The request counter saw the test's own requests and the
	// scheduler's binding, each under its component.
	counts := cp.RequestCounts()
	self := component(rest.DefaultKubernetesUserAgent())
	for key, want := range map[RequestKey]int{
		{Component: self, Verb: "create", Resource: "pods"}:                     1,
		{Component: self, Verb: "create", Resource: "nodes"}:                    1,
		{Component: self, Verb: "update", Resource: "nodes/status"}:             1,
		{Component: "kube-scheduler", Verb: "create", Resource: "pods/binding"}: 1,
	} {
		if got := counts[key]; got != want {
			t.Errorf("requests %+v: got %d, want %d", key, got, want)
		}
	}
	if d := cp.RequestCounts().Sub(counts); len(d) != 0 {
		t.Logf("requests between two snapshots: %v", d)
	}
}

func TestComponent(t *testing.T) {
	for _, tc := range []struct{ userAgent, want string }{
		{"kubelet/node-000", "kubelet"},
		{"gpudra-kubelet-plugin/node-000", "gpudra-kubelet-plugin"},
		{"gpudra-sim/v0.0.0 (linux/amd64) kubernetes/$Format/scheduler", "kube-scheduler"},
		{"localcluster-controller-manager", "localcluster-controller-manager"},
		{"", "unknown"},
	} {
		if got := component(tc.userAgent); got != tc.want {
			t.Errorf("component(%q) = %q, want %q", tc.userAgent, got, tc.want)
		}
	}
}

func TestRequestCountsSub(t *testing.T) {
	a := RequestKey{Component: "kubelet", Verb: "get", Resource: "resourceclaims"}
	b := RequestKey{Component: "kubelet", Verb: "update", Resource: "pods/status"}
	before := RequestCounts{a: 2, b: 1}
	after := RequestCounts{a: 5, b: 1}
	got := after.Sub(before)
	if len(got) != 1 || got[a] != 3 {
		t.Errorf("Sub = %v, want only %v: 3", got, a)
	}
}
