package node

import (
	"context"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/pkg/computedomain"
	"github.com/gpudra/gpudra/pkg/imex"
)

func twoFreePorts(t *testing.T) (int, int) {
	t.Helper()
	a, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = a.Close(); _ = b.Close() }()
	return a.Addr().(*net.TCPAddr).Port, b.Addr().(*net.TCPAddr).Port
}

// TestNodeDaemonJoinsAndLeavesPerDomain: claims hold the node's one daemon
// for every domain; the node reports in a domain while any claim of it is
// prepared, and leaves it with the last one.
func TestNodeDaemonJoinsAndLeavesPerDomain(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	kube := fake.NewClientset()
	(&applyConfigMaps{}).install(kube)
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{computedomain.CliqueGVR: "ComputeDomainCliqueList"})
	rec := &cliqueRecorder{}
	rec.install(dyn)
	dir := t.TempDir()
	port, cmdPort := twoFreePorts(t)
	n, err := NewDaemon(DaemonConfig{
		Supervisor: imex.Options{
			Config:        imex.Config{Dir: filepath.Join(dir, "imex"), NodeIP: "127.0.0.1", ServerPort: port, CmdPort: cmdPort, MaxNodes: 4},
			Binary:        filepath.Join(fakeIMEXBin, imex.DaemonName),
			Ctl:           filepath.Join(fakeIMEXBin, imex.CtlName),
			CheckInterval: 200 * time.Millisecond,
			IdleStop:      time.Hour,
		},
		Reporter: ReporterConfig{Dynamic: dyn, Namespace: "gpudra", NodeName: "node-a", NodeIP: "127.0.0.1",
			Indices: &IndexRegistry{Client: kube, Namespace: "gpudra", MaxNodes: 4}},
		HostsFile: filepath.Join(dir, "hosts"),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = n.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		n.Supervisor().Stop(context.Background())
	})

	const clique = "cluster.1"
	for _, h := range []struct{ claim, domain string }{{"c1", "dom-a"}, {"c2", "dom-a"}, {"c3", "dom-b"}} {
		if err := n.Hold(ctx, h.claim, h.domain, clique); err != nil {
			t.Fatal(err)
		}
	}
	waitCtx, waitCancel := context.WithTimeout(ctx, 20*time.Second)
	defer waitCancel()
	if err := n.WaitReady(waitCtx); err != nil {
		t.Fatal(err)
	}
	if got := n.Reporter().Domains(); !slices.Equal(got, []string{"dom-a", "dom-b"}) {
		t.Fatalf("domains %v", got)
	}
	if h := n.Supervisor().Holders(); h != 3 {
		t.Errorf("holders %d, want 3", h)
	}
	rec.taken()
	// The cliques as the API server holds them, for the leaves' gets.
	for _, d := range []string{"dom-a", "dom-b"} {
		name := computedomain.CliqueName(d, clique)
		rec.objs[name] = &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": name},
			"daemons": []any{map[string]any{"nodeName": "node-a", "index": int64(0)}}}}
	}

	if err := n.Release(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	for _, p := range rec.taken() {
		if p.GetPatchType() == types.JSONPatchType {
			t.Errorf("left %s while claim c2 of dom-a is prepared", p.GetName())
		}
	}
	if err := n.Release(ctx, "c2"); err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, p := range rec.taken() {
		if p.GetPatchType() == types.JSONPatchType {
			left = append(left, p.GetName())
		}
	}
	if !slices.Equal(left, []string{computedomain.CliqueName("dom-a", clique)}) {
		t.Errorf("left %v, want only dom-a's clique", left)
	}
	if got := n.Reporter().Domains(); !slices.Equal(got, []string{"dom-b"}) {
		t.Errorf("domains %v after dom-a's last claim, want [dom-b]", got)
	}
	if st := n.Supervisor().Status(); st.PID == 0 || n.Supervisor().Holders() != 1 {
		t.Errorf("the daemon must stay for dom-b's claim: %+v, holders %d", st, n.Supervisor().Holders())
	}
}
