package fleetview

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// startServer serves a fleet view of client; probeErr makes the API
// server probe fail while it holds an error.
func startServer(t *testing.T, client *fake.Clientset) (*httptest.Server, *atomic.Pointer[error]) {
	t.Helper()
	var probeErr atomic.Pointer[error]
	ctx, cancel := context.WithCancel(context.Background())
	s := New(client, Options{Driver: driver, Debounce: 10 * time.Millisecond, ProbeInterval: 20 * time.Millisecond, Probe: func(context.Context) error {
		if err := probeErr.Load(); err != nil {
			return *err
		}
		return nil
	}})
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		cancel()
		<-done
	})
	return srv, &probeErr
}

type snapshotDoc struct {
	Version uint64 `json:"version"`
	Status  Status `json:"status"`
	Nodes   []Node `json:"nodes"`
}

// waitSnapshot polls GET /api/snapshot until ok accepts it.
func waitSnapshot(t *testing.T, srv *httptest.Server, ok func(snapshotDoc) bool) snapshotDoc {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var doc snapshotDoc
	for time.Now().Before(deadline) {
		resp, err := http.Get(srv.URL + "/api/snapshot")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		doc = snapshotDoc{}
		if err := json.Unmarshal(body, &doc); err != nil {
			t.Fatalf("snapshot is not JSON: %v\n%s", err, body)
		}
		if ok(doc) {
			return doc
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("snapshot never as wanted; last: %+v", doc)
	return doc
}

// eventStream reads server-sent events.
type eventStream struct {
	r    *bufio.Reader
	body io.Closer
}

func openEvents(t *testing.T, srv *httptest.Server) *eventStream {
	t.Helper()
	resp, err := http.Get(srv.URL + "/api/events")
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return &eventStream{r: bufio.NewReader(resp.Body), body: resp.Body}
}

// next returns the next event's name and data.
func (e *eventStream) next(t *testing.T) (string, []byte) {
	t.Helper()
	var name string
	var data []byte
	for {
		line, err := e.r.ReadString('\n')
		if err != nil {
			t.Fatalf("event stream: %v", err)
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "" && name != "":
			return name, data
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data = []byte(strings.TrimPrefix(line, "data: "))
		}
	}
}

// until reads events until ok accepts one, within 10 s.
func (e *eventStream) until(t *testing.T, ok func(name string, data []byte) bool) []byte {
	t.Helper()
	timer := time.AfterFunc(10*time.Second, func() { e.body.Close() })
	defer timer.Stop()
	for {
		name, data := e.next(t)
		if ok(name, data) {
			return data
		}
	}
}

func demoObjects() []runtime.Object {
	return []runtime.Object{
		node("n1", corev1.ConditionTrue), node("n2", corev1.ConditionTrue),
		slice("n1", gpuDevices(0, false)...), slice("n2", gpuDevices(0, false)...),
		claim("ml", "c1", []string{"p1"}, result("n1", "gpu-0")),
		pod("ml", "p1", corev1.PodRunning, "c1"),
	}
}

// TestSnapshotAndDelta: the snapshot holds the fleet; deleting a pod
// sends a delta with only its node, without the pod.
func TestSnapshotAndDelta(t *testing.T) {
	client := fake.NewClientset(demoObjects()...)
	srv, _ := startServer(t, client)
	doc := waitSnapshot(t, srv, func(d snapshotDoc) bool {
		return len(d.Nodes) == 2 && len(d.Nodes[0].GPUs) == 1 && len(d.Nodes[0].GPUs[0].Holders) == 1 && len(d.Nodes[0].GPUs[0].Holders[0].Pods) == 1
	})
	if h := doc.Nodes[0].GPUs[0].Holders[0]; h.Claim != "ml/c1" || h.Pods[0] != (PodRef{Name: "ml/p1", Phase: "Running"}) {
		t.Errorf("holder %+v", h)
	}
	events := openEvents(t, srv)
	if name, data := events.next(t); name != "snapshot" || !strings.Contains(string(data), `"ml/p1"`) {
		t.Fatalf("first event %s %s, want the snapshot with the pod", name, data)
	}
	if err := client.CoreV1().Pods("ml").Delete(context.Background(), "p1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	data := events.until(t, func(name string, _ []byte) bool { return name == "delta" })
	var d struct {
		Version uint64 `json:"version"`
		Nodes   []Node `json:"nodes"`
		Removed []string
	}
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	// The claim is still reserved for the pod (nothing here runs the
	// controller that would release it): the pod stays named, its phase
	// unknown.
	if len(d.Nodes) != 1 || d.Nodes[0].Name != "n1" || len(d.Removed) != 0 || d.Version <= doc.Version {
		t.Fatalf("delta %s: want only node n1, version after %d", data, doc.Version)
	}
	if pods := d.Nodes[0].GPUs[0].Holders[0].Pods; len(pods) != 1 || pods[0].Phase != "" {
		t.Errorf("pods after the delete: %+v, want the reserved pod without a phase", pods)
	}

	// The claim released: the GPU is free again; a node goes.
	c, err := client.ResourceV1().ResourceClaims("ml").Get(context.Background(), "c1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Status = resourceapi.ResourceClaimStatus{}
	if _, err := client.ResourceV1().ResourceClaims("ml").UpdateStatus(context.Background(), c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.CoreV1().Nodes().Delete(context.Background(), "n2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client.ResourceV1().ResourceSlices().Delete(context.Background(), "n2-"+driver, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSnapshot(t, srv, func(d snapshotDoc) bool {
		return len(d.Nodes) == 1 && len(d.Nodes[0].GPUs[0].Holders) == 0 && d.Status.Slices == 1
	})
}

// TestStatus: the API server going and coming back, a forbidden list and
// a cluster without the driver's slices show in the status.
func TestStatus(t *testing.T) {
	t.Run("API server gone and back", func(t *testing.T) {
		srv, probeErr := startServer(t, fake.NewClientset(demoObjects()...))
		events := openEvents(t, srv)
		down := errors.New("connection refused")
		probeErr.Store(&down)
		events.until(t, func(name string, data []byte) bool {
			var st Status
			return name == "status" && json.Unmarshal(data, &st) == nil && st.APIServer == "connection refused" && st.APIServerDownSince != ""
		})
		probeErr.Store(nil)
		events.until(t, func(name string, data []byte) bool {
			var st Status
			return name == "status" && json.Unmarshal(data, &st) == nil && st.APIServer == "" && st.Slices == 2
		})
	})
	t.Run("list pods forbidden", func(t *testing.T) {
		client := fake.NewClientset(demoObjects()...)
		client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New(`User "viewer" cannot list resource "pods" in API group "" at the cluster scope`))
		})
		srv, _ := startServer(t, client)
		// Each resource syncs on its own: wait until all but pods have,
		// not only until the claims show (seen on a loaded CI machine:
		// nodes still "waiting" in the first snapshot with both nodes).
		doc := waitSnapshot(t, srv, func(d snapshotDoc) bool {
			forbidden, othersSynced := false, true
			for _, r := range d.Status.Resources {
				switch {
				case r.Resource == "pods":
					forbidden = r.State == StateForbidden && r.Verb == "list"
				case r.State != StateSynced:
					othersSynced = false
				}
			}
			return forbidden && othersSynced && len(d.Nodes) == 2 && len(d.Nodes[0].GPUs[0].Holders) == 1
		})
		// The rest is shown: the claim, and its reserved pod by name.
		if pods := doc.Nodes[0].GPUs[0].Holders[0].Pods; len(pods) != 1 || pods[0].Name != "ml/p1" {
			t.Errorf("pods %+v", pods)
		}
		for _, r := range doc.Status.Resources {
			if r.Resource != "pods" && r.State != StateSynced {
				t.Errorf("%s: %s, want synced", r.Resource, r.State)
			}
		}
	})
	t.Run("no slices of the driver", func(t *testing.T) {
		srv, _ := startServer(t, fake.NewClientset(node("n1", corev1.ConditionTrue)))
		doc := waitSnapshot(t, srv, func(d snapshotDoc) bool {
			for _, r := range d.Status.Resources {
				if r.State != StateSynced {
					return false
				}
			}
			return len(d.Nodes) == 1
		})
		if doc.Status.Slices != 0 || doc.Status.Driver != driver || len(doc.Nodes[0].GPUs) != 0 {
			t.Errorf("status %+v, nodes %+v", doc.Status, doc.Nodes)
		}
	})
}

// TestPageAndAssets: the page and its assets come from the binary, and
// nothing but GET is served.
func TestPageAndAssets(t *testing.T) {
	srv, _ := startServer(t, fake.NewClientset())
	for _, tc := range []struct {
		method, path string
		status       int
		contains     string
	}{
		{"GET", "/", 200, `<script src="app.js">`},
		{"GET", "/app.js", 200, "EventSource"},
		{"GET", "/style.css", 200, ".gpu"},
		{"GET", "/?q=ml%2Fp1", 200, "<input id=\"search\""},
		{"POST", "/api/snapshot", 405, ""},
		{"GET", "/nothing", 404, ""},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(string(body), tc.contains) {
			t.Errorf("%s %s: %d, want %d with %q", tc.method, tc.path, resp.StatusCode, tc.status, tc.contains)
		}
	}
	// No asset is fetched from elsewhere.
	for _, f := range []string{"web/index.html", "web/app.js", "web/style.css"} {
		data, err := web.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), "http://") || strings.Contains(string(data), "https://") {
			t.Errorf("%s names an external URL", f)
		}
	}
}
