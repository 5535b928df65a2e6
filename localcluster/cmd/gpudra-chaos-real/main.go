// Command gpudra-chaos-real runs gpudra's chaos trials (internal/chaos of
// the driver module) against the local cluster's real etcd and
// kube-apiserver (package chaosreal): `make chaos-real` runs it. It takes
// gpudra-chaos's flags; its last line reads "chaos: <N> trials, <M>
// invariant violations", and it exits 1 when M > 0.
package main

import (
	"flag"
	"io"
	"os"

	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/internal/chaos"
	"github.com/gpudra/gpudra/internal/mpsfake"
	"github.com/gpudra/gpudra/localcluster/test/chaosreal"
)

func main() {
	// The plugin starts MPS daemons through this program, as the fake
	// nvidia-cuda-mps-control.
	if code, ok := mpsfake.Main(); ok {
		os.Exit(code)
	}
	// The control plane's components log through klog at length; the
	// trials' lines are what this command prints.
	kfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(kfs)
	for k, v := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL"} {
		_ = kfs.Set(k, v)
	}
	klog.SetOutput(io.Discard)
	os.Exit(chaos.Main(os.Args[1:], os.Stdout, os.Stderr, "make chaos-real CHAOS_ARGS='-seed %d -trials 5'", chaosreal.SetUp))
}
