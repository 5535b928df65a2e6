package cdbench

import (
	"flag"
	"io"
	"os"
	"testing"

	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/localcluster/cluster"
)

func TestMain(m *testing.M) {
	// Started as one of the nodes' fake daemons (cluster.Start installs
	// them).
	if code, ok := cluster.Main(); ok {
		os.Exit(code)
	}
	klog.InitFlags(nil)
	flag.Parse()
	if !testing.Verbose() {
		// The components log a lot at level 0; a benchmark prints its
		// figures only.
		_ = flag.Set("logtostderr", "false")
		_ = flag.Set("alsologtostderr", "false")
		_ = flag.Set("stderrthreshold", "FATAL")
		klog.SetOutput(io.Discard)
	}
	os.Exit(m.Run())
}
