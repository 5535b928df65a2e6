package e2e

import (
	"context"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpudra/gpudra/pkg/simfleet"

	"github.com/gpudra/gpudra/localcluster/cluster"
)

// leakAllowlist names the goroutines that upstream components leave
// behind after a clean stop, each with why it cannot be stopped.
func leakAllowlist() []goleak.Option {
	return []goleak.Option{
		// kube-apiserver's "log" health check starts a wait.Forever once
		// per process (healthz.LogHealthz); it has no stop. goleak 1.3
		// cannot match on the creator, so any wait.Forever is allowed:
		// by its name it is never meant to stop.
		goleak.IgnoreAnyFunction("k8s.io/apimachinery/pkg/util/wait.Forever"),
	}
}

// findLeaks looks for goroutines beyond those running before the cluster
// started and the allowlist. It waits up to five seconds for stragglers:
// some upstream goroutines end on a timer after their server stopped
// (the watch cache's freshness wait wakes up after its 3 s block
// timeout), which goleak's own retries (about 2 s) do not cover.
func findLeaks(before goleak.Option) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := goleak.Find(append(leakAllowlist(), before)...)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// tempEntries lists the names in the temporary directory.
func tempEntries() []string {
	entries, _ := os.ReadDir(os.TempDir())
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// newEntries returns the names in after that are not in before.
func newEntries(before, after []string) []string {
	var out []string
	for _, n := range after {
		if !slices.Contains(before, n) {
			out = append(out, n)
		}
	}
	return out
}

// TestStartStopTwice starts a second, one-node cluster twice in a row
// while the shared one runs: both work, and each stop leaves no port
// open and no directory behind.
func TestStartStopTwice(t *testing.T) {
	fleet, err := simfleet.Load("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		before := tempEntries()
		c, err := cluster.Start(ctx, cluster.Options{Fleet: fleet})
		if err != nil {
			cancel()
			t.Fatalf("start %d: %v", i, err)
		}
		slices, err := c.Client().ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil || len(slices.Items) == 0 {
			t.Errorf("start %d: slices %v, err %v", i, len(slices.Items), err)
		}
		listening := c.ControlPlane().Listening()
		if len(listening) < 3 {
			t.Errorf("start %d: listening on %v, want etcd client and peer and kube-apiserver", i, listening)
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stop %d: %v", i, err)
		}
		cancel()
		for _, addr := range listening {
			if conn, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
				conn.Close()
				t.Errorf("start %d: port %s still open after stop", i, addr)
			}
		}
		if left := newEntries(before, tempEntries()); len(left) != 0 {
			t.Errorf("start %d: left in %s: %v", i, os.TempDir(), left)
		}
	}
}
