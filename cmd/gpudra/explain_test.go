package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/deployments/deviceclasses"
	"github.com/gpudra/gpudra/pkg/explain"
)

func TestExplainRejectsBadArguments(t *testing.T) {
	for _, tc := range []struct {
		args []string
		err  string
	}{
		{[]string{"explain", "-o", "yaml", "pod/x"}, `--output "yaml": supported values: text, json`},
		{[]string{"explain", "deployment/x"}, `unknown kind "deployment"`},
		{[]string{"explain"}, "accepts 1 arg(s), received 0"},
	} {
		cmd := newRootCommand()
		cmd.SetArgs(tc.args)
		cmd.SetOut(&strings.Builder{})
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%v: got %v, want %q", tc.args, err, tc.err)
		}
	}
}

// TestExplainUsesTheKubeconfig: the namespace defaults to the kubeconfig
// context's, the API server named there is asked, only with GETs, and a
// missing pod is named.
func TestExplainUsesTheKubeconfig(t *testing.T) {
	var mu sync.Mutex
	var methods []string
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		methods = append(methods, r.Method+" "+r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`)
	}))
	defer server.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: ml}}]
current-context: x
`, server.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := newRootCommand()
	cmd.SetArgs([]string{"explain", "--kubeconfig", kubeconfig, "train-0"})
	err := cmd.Execute()
	if err == nil || err.Error() != "pod ml/train-0 not found" {
		t.Errorf("got %v, want pod ml/train-0 not found", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"GET /api/v1/namespaces/ml/pods/train-0"}; fmt.Sprint(methods) != fmt.Sprint(want) {
		t.Errorf("requests %v, want %v", methods, want)
	}
}

// TestExplainReport: the slices `gpudra inspect -o json` prints, served by
// a fake API server, explain a pod that asks for 9 GPUs.
func TestExplainReport(t *testing.T) {
	var out strings.Builder
	cmd := newRootCommand()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"inspect", "--fleet", "dgx-h100", "--vfio", "off", "-o", "json"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	var list struct{ Items []resourceapi.ResourceSlice }
	if err := json.Unmarshal([]byte(out.String()), &list); err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	for i := range list.Items {
		objs = append(objs, &list.Items[i])
	}
	classes, err := deviceclasses.All()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range classes {
		objs = append(objs, c)
	}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "nine"}, Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpus", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 9},
	}}}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train-0"}, Spec: corev1.PodSpec{
		Containers:     []corev1.Container{{Name: "c"}},
		ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To("nine")}},
	}}
	objs = append(objs, claim, pod, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dgx-h100-0"}})

	var report strings.Builder
	if err := explainTo(context.Background(), &report, fake.NewClientset(objs...), explain.Target{Kind: explain.KindPod, Namespace: "ml", Name: "train-0"}, "text"); err != nil {
		t.Fatal(err)
	}
	want := `pod ml/train-0: cannot allocate: no node of 1 fits every claim
  claim nine: fits on no node
    request gpus: FAILS: asks for 9 devices of class gpu.nvidia.com; the cluster has 8, at most 8 on one node (dgx-h100-0); 0 nodes can satisfy it
`
	if report.String() != want {
		t.Errorf("got\n%s\nwant\n%s", report.String(), want)
	}
}
