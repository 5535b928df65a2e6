package chaosreal_test

import (
	"context"
	"flag"
	"io"
	"os"
	"strconv"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/internal/chaos"
	"github.com/gpudra/gpudra/internal/mpsfake"
	"github.com/gpudra/gpudra/localcluster/test/chaosreal"
)

// TestMain runs the fake MPS control binary when the test binary is
// executed as one (the plugin starts MPS daemons through it).
func TestMain(m *testing.M) {
	if code, ok := mpsfake.Main(); ok {
		os.Exit(code)
	}
	// The control plane's components log through klog at length, at
	// level 0 too; the trials' lines are what the test logs.
	klog.InitFlags(nil)
	flag.Parse()
	_ = flag.Set("logtostderr", "false")
	_ = flag.Set("alsologtostderr", "false")
	_ = flag.Set("stderrthreshold", "FATAL")
	klog.SetOutput(io.Discard)
	os.Exit(m.Run())
}

// seedEnv replays one trial against the real API server:
// GPUDRA_CHAOS_SEED=<seed> go test -run TestChaosRealAPIServer ./chaosreal.
const seedEnv = "GPUDRA_CHAOS_SEED"

// TestChaosRealAPIServer is the short form of `make chaos-real`: a few
// trials with the plugin killed at random moments, against kube-apiserver
// through the cutting proxy, one of them with an API outage of a few
// seconds.
func TestChaosRealAPIServer(t *testing.T) {
	o := chaos.ShortOptions()
	// Seeds 1 to 4 (4: the outage): each kills the plugin, and their
	// claims are of every kind but one.
	o.Trials, o.Steps, o.OutageEvery = 4, 4, 4
	// Without the lost checkpoints, stale allocations and rolling updates
	// of the in-repo short form: those need no real API server, and have
	// not yet run against kube-apiserver (make chaos-real runs them).
	o.LossProbability, o.StaleProbability, o.RollingProbability = 0, 0, 0
	if s := os.Getenv(seedEnv); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", seedEnv, s, err)
		}
		o.Trials, o.Seed, o.Replay, o.Keep, o.Trace = 1, seed, true, true, true
	}
	o.Out = testWriter{t}
	o.ReplayCommand = seedEnv + "=%d go test -run TestChaosRealAPIServer ./chaosreal"
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s, err := chaosreal.Start(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := s.Stop(); err != nil {
			t.Error(err)
		}
	}()
	o.API = s.Factory()
	sum, err := chaos.Run(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Violations) > 0 {
		t.Errorf("%s; failing seeds %v (replay one with %s=<seed>)", sum.Line(), sum.FailedSeeds, seedEnv)
	}
	if sum.Trials != o.Trials || sum.Kills == 0 || sum.Calls == 0 || len(sum.Claims) < 4 {
		t.Errorf("%d trials killed the plugin %d times in %d DRA calls, with claims of %d kinds: they check little", sum.Trials, sum.Kills, sum.Calls, len(sum.Claims))
	}
	if os.Getenv(seedEnv) == "" && len(sum.Outages) != 1 {
		t.Errorf("%d API outages, want 1", len(sum.Outages))
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}
