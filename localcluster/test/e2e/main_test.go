// Package e2e runs gpudra's end-to-end tests on the local cluster: the
// real kube-scheduler allocates from the ResourceSlices gpudra publishes,
// and the kubelet's own DRA code prepares claims through gpudra's gRPC
// sockets.
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gpudra/gpudra/pkg/simfleet"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// demo is the cluster most tests share: the demo fleet with all examples
// applied.
var demo *cluster.Cluster

// examplesDir is the repository's examples directory.
func examplesDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "examples")
}

func TestMain(m *testing.M) {
	// Started as nvidia-cuda-mps-control, nvidia-imex or nvidia-imex-ctl:
	// the nodes' simulated daemons (cluster.Start installs them).
	if code, ok := cluster.Main(); ok {
		os.Exit(code)
	}
	// Only errors in a passing run's output.
	clustertest.ParseFlags("ERROR")
	// A temporary directory of the suite's own, so that what the
	// clusters leave behind can be told from other programs' files.
	tmp, err := os.MkdirTemp("", "gpudra-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("TMPDIR", tmp)
	code := run(m)
	if err := os.Remove(tmp); err != nil {
		fmt.Fprintln(os.Stderr, "temporary directory not empty:", err)
		_ = os.RemoveAll(tmp)
		code = 1
	}
	os.Exit(code)
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	before := goleak.IgnoreCurrent()
	tmpBefore := tempEntries()
	fleet, err := simfleet.Load("demo")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	start := time.Now()
	// The demo fleet's GB200 trays run examples/compute-domain with fake
	// IMEX daemons, which the cluster installs, as it does the fake MPS
	// control binary.
	demo, err = cluster.Start(ctx, cluster.Options{Fleet: fleet})
	if err != nil {
		fmt.Fprintln(os.Stderr, "start local cluster:", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "local cluster up in %v\n", time.Since(start).Round(time.Millisecond))
	code := m.Run()
	if err := demo.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stop local cluster:", err)
		code = 1
	}
	if left := newEntries(tmpBefore, tempEntries()); len(left) != 0 {
		fmt.Fprintf(os.Stderr, "left in %s after the local cluster stopped: %v\n", os.TempDir(), left)
		code = 1
	}
	if code == 0 {
		if err := findLeaks(before); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left after the local cluster stopped:", err)
			code = 1
		}
	}
	return code
}
