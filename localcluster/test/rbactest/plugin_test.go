package rbactest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	"github.com/gpudra/gpudra/deployments/deviceclasses"
	"github.com/gpudra/gpudra/deployments/rbac"
	"github.com/gpudra/gpudra/pkg/simfleet"

	"github.com/gpudra/gpudra/localcluster/simnode"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// refusals records the API requests the server refused for lack of a
// permission: 403s, and 422s carrying a Forbidden cause (the per-driver
// status check answers so).
type refusals struct {
	mu   sync.Mutex
	seen []string
}

func (r *refusals) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		resp, err := rt.RoundTrip(req)
		if err != nil || (resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusUnprocessableEntity) {
			return resp, err
		}
		body, readErr := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(body))
		if readErr != nil || resp.StatusCode == http.StatusForbidden || bytes.Contains(body, []byte("Forbidden")) {
			r.mu.Lock()
			r.seen = append(r.seen, fmt.Sprintf("%s %s: %d %s", req.Method, req.URL.Path, resp.StatusCode, statusMessage(body)))
			r.mu.Unlock()
		}
		return resp, nil
	})
}

func (r *refusals) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.seen...)
}

// statusMessage is the message of the Status in a response body (JSON or
// protobuf).
func statusMessage(body []byte) string {
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(body, nil, nil)
	if status, ok := obj.(*metav1.Status); err == nil && ok {
		return status.Message
	}
	return strconv.Quote(string(body))
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// TestKubeletPluginRunsAsServiceAccount runs gpudra's kubelet plugin on a
// simulated node with only the shipped RBAC, as its pods' tokens present
// it, and a pod through prepare and unprepare: the plugin publishes its
// slices and serves the kubelet without one refused request.
func TestKubeletPluginRunsAsServiceAccount(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	cp, admin, stop := startControlPlane(t, ctx)
	defer stop()

	objs, err := rbac.KubeletPlugin(pluginNS, driver)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: pluginNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().ServiceAccounts(pluginNS).Create(ctx, objs.ServiceAccount, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, objs.ClusterRole, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, objs.ClusterRoleBinding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	classes, err := deviceclasses.All()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range classes {
		if _, err := admin.ResourceV1().DeviceClasses().Create(ctx, c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	fleet, err := simfleet.Parse([]byte("nodes:\n- name: "+nodeA+"\n  gpus:\n  - model: A100-SXM4-40GB\n"), "rbactest")
	if err != nil {
		t.Fatal(err)
	}
	fn, err := fleet.Node(nodeA)
	if err != nil {
		t.Fatal(err)
	}
	var refused refusals
	pluginCfg := cp.RESTConfig("gpudra-kubelet-plugin/"+nodeA, 100, 200)
	pluginCfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + pluginNS + ":" + objs.ServiceAccount.Name,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + pluginNS, "system:authenticated"},
		Extra:    map[string][]string{nodeKey: {nodeA}},
	}
	pluginCfg.Wrap(refused.wrap)
	dir := clustertest.ShortTempDir(t)
	node, err := simnode.Start(ctx, simnode.Config{
		Name:          nodeA,
		DriverName:    driver,
		Hardware:      fn.Hardware(),
		Dir:           dir,
		KubeletClient: admin,
		PluginClient:  kubernetes.NewForConfigOrDie(pluginCfg),
	})
	if err != nil {
		t.Fatalf("start node with the plugin as its ServiceAccount: %v (refused: %v)", err, refused.list())
	}
	defer node.Stop()
	t.Logf("control plane and node with the plugin up in %v", time.Since(start))

	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceDefault, Name: "one-gpu"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: deviceclasses.GPU}},
		}}},
	}
	if _, err := admin.ResourceV1().ResourceClaims(claim.Namespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: claim.Namespace, Name: "trainer",
			Annotations: map[string]string{simnode.RunForAnnotation: "200ms"}},
		Spec: corev1.PodSpec{
			RestartPolicy:  corev1.RestartPolicyNever,
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim.Name}},
			Containers: []corev1.Container{{Name: "c", Image: "cuda",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
		},
	}
	if _, err := admin.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var last *corev1.Pod
	err = clustertest.Poll(ctx, time.Minute, func() bool {
		last, err = admin.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		return err == nil && last.Status.Phase == corev1.PodSucceeded
	})
	if err != nil {
		t.Fatalf("pod did not run to completion: %v; last seen %+v; refused: %v", err, last.Status, refused.list())
	}
	// A finished pod's claims are unprepared: the plugin removes the
	// claim's CDI spec.
	specs := func() []string {
		entries, _ := os.ReadDir(node.CDIDir())
		var files []string
		for _, e := range entries {
			if !e.IsDir() {
				files = append(files, e.Name())
			}
		}
		return files
	}
	err = clustertest.Poll(ctx, 30*time.Second, func() bool {
		return len(specs()) == 0
	})
	if err != nil {
		t.Errorf("claim not unprepared: CDI specs left %v", specs())
	}
	if got := refused.list(); len(got) != 0 {
		t.Errorf("the API server refused the plugin %d requests:\n%s", len(got), strings.Join(got, "\n"))
	}
}
