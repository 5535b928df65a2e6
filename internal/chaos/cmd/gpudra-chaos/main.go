// Command gpudra-chaos runs gpudra's chaos trials (package chaos): `make
// chaos` runs it. Its last line reads "chaos: <N> trials, <M> invariant
// violations"; it exits 1 when M > 0.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpudra/gpudra/internal/chaos"
	"github.com/gpudra/gpudra/pkg/mps/mpsfake"
)

func main() {
	// The plugin starts MPS daemons through this program, as the fake
	// nvidia-cuda-mps-control.
	if code, ok := mpsfake.Main(); ok {
		os.Exit(code)
	}
	o := chaos.LongOptions()
	seed := flag.Int64("seed", -1, "replay the trial of this seed (its outage included) -trials times (default once), keeping the directories and logs of failures")
	flag.IntVar(&o.Trials, "trials", o.Trials, "number of trials")
	flag.Uint64Var(&o.Seed, "first-seed", o.Seed, "seed of the first trial; trial i uses first-seed+i")
	flag.IntVar(&o.Steps, "steps", o.Steps, "rounds of kubelet calls per trial")
	flag.Float64Var(&o.KillProbability, "kill-probability", o.KillProbability, "chance of a SIGKILL of the plugin in a round")
	flag.DurationVar(&o.MaxKillDelay, "max-kill-delay", o.MaxKillDelay, "longest delay between a round's calls and the kill")
	flag.DurationVar(&o.Outage, "outage", o.Outage, "length of the API outage of every outage-every-th trial (0: none)")
	flag.IntVar(&o.OutageEvery, "outage-every", o.OutageEvery, "one trial in this many has an API outage")
	flag.DurationVar(&o.CallTimeout, "call-timeout", o.CallTimeout, "the kubelet's DRA call timeout")
	flag.StringVar(&o.Binary, "binary", "", "gpudra binary to run (default: build ./cmd/gpudra)")
	flag.StringVar(&o.WorkDir, "work-dir", "/tmp", "directory for the trials (keep it short: unix socket paths)")
	flag.BoolVar(&o.Keep, "keep", false, "keep the directories and plugin logs of failing trials")
	flag.BoolVar(&o.Trace, "trace", false, "print every call, outcome and kill")
	flag.Parse()
	if *seed >= 0 {
		o.Seed, o.Replay, o.Keep = uint64(*seed), true, true
		if !flagSet("trials") {
			o.Trials = 1
		}
	}
	o.Out = os.Stdout
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sum, err := chaos.Run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		if sum != nil {
			fmt.Println(sum.Line())
		}
		os.Exit(2)
	}
	if len(sum.Violations) > 0 {
		os.Exit(1)
	}
}

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
