package chaos_test

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/gpudra/gpudra/internal/chaos"
	"github.com/gpudra/gpudra/internal/mpsfake"
)

// TestMain runs the fake MPS control binary when the test binary is
// executed as one (the plugin starts MPS daemons through it).
func TestMain(m *testing.M) {
	if code, ok := mpsfake.Main(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// seedEnv replays one trial: GPUDRA_CHAOS_SEED=<seed> go test ./internal/chaos;
// traceEnv set as well traces its calls.
const (
	seedEnv  = "GPUDRA_CHAOS_SEED"
	traceEnv = "GPUDRA_CHAOS_TRACE"
)

// TestChaos is the short form of `make chaos`: a few trials of random
// claims with the plugin killed at random moments, checkpoints lost while
// it is down, claims allocated to held devices and rolling updates, one
// trial with an API outage of a few seconds.
func TestChaos(t *testing.T) {
	o := chaos.ShortOptions()
	if s := os.Getenv(seedEnv); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", seedEnv, s, err)
		}
		o.Trials, o.Seed, o.Replay, o.Keep = 1, seed, true, true
		o.Trace = os.Getenv(traceEnv) != ""
	}
	o.Out = testWriter{t}
	sum, err := chaos.Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Violations) > 0 {
		t.Errorf("%s; failing seeds %v (replay one with %s=<seed>)", sum.Line(), sum.FailedSeeds, seedEnv)
	}
	if sum.Kills == 0 || len(sum.Claims) < 5 {
		t.Errorf("the run killed the plugin %d times and made claims of %d kinds: it checks little", sum.Kills, len(sum.Claims))
	}
	lost := 0
	for _, n := range sum.Damages {
		lost += n
	}
	if os.Getenv(seedEnv) == "" && (lost == 0 || sum.StaleClaims == 0 || sum.RollingUpdates == 0 || sum.RacedPairs == 0) {
		t.Errorf("the run lost %d checkpoints, made %d stale allocations, %d rolling updates and %d raced Prepare/Unprepare pairs: a class did not run",
			lost, sum.StaleClaims, sum.RollingUpdates, sum.RacedPairs)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}
