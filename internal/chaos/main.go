package chaos

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// SetUp starts what the trials of a command share, once its flags are
// parsed: it returns the trials' API servers (nil: package apiserver's)
// and a function that ends them.
type SetUp func(ctx context.Context, o *Options) (APIServerFactory, func() error, error)

// Main is the body of the chaos commands, `make chaos` (gpudra-chaos) and
// `make chaos-real` (the local cluster's gpudra-chaos-real): it parses
// args (without the program name) into the options of the long form,
// runs the trials and returns the exit code: 1 when an invariant was
// violated, 2 when the run could not be made. replay is the command that
// replays a seed, with %d for it. The program must have called
// mpsfake.Main first.
func Main(args []string, stdout, stderr io.Writer, replay string, setUp SetUp) int {
	o := LongOptions()
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	seed := fs.Int64("seed", -1, "replay the trial of this seed (its outage included) -trials times (default once), keeping the directories and logs of failures")
	fs.IntVar(&o.Trials, "trials", o.Trials, "number of trials")
	fs.Uint64Var(&o.Seed, "first-seed", o.Seed, "seed of the first trial; trial i uses first-seed+i")
	fs.IntVar(&o.Steps, "steps", o.Steps, "rounds of kubelet calls per trial")
	fs.Float64Var(&o.KillProbability, "kill-probability", o.KillProbability, "chance of a SIGKILL of the plugin in a round")
	fs.DurationVar(&o.MaxKillDelay, "max-kill-delay", o.MaxKillDelay, "longest delay between a round's calls and the kill")
	fs.DurationVar(&o.Outage, "outage", o.Outage, "length of the API outage of every outage-every-th trial (0: none)")
	fs.IntVar(&o.OutageEvery, "outage-every", o.OutageEvery, "one trial in this many has an API outage")
	fs.Float64Var(&o.LossProbability, "loss-probability", o.LossProbability, "chance that the checkpoint is lost (deleted, a dangling link, truncated) before a restart")
	fs.Float64Var(&o.StaleProbability, "stale-probability", o.StaleProbability, "chance that a round allocates a claim to devices a running claim holds")
	fs.Float64Var(&o.RollingProbability, "rolling-probability", o.RollingProbability, "chance that a round is a rolling update (a second plugin instance)")
	fs.DurationVar(&o.CallTimeout, "call-timeout", o.CallTimeout, "the kubelet's DRA call timeout")
	fs.StringVar(&o.Binary, "binary", "", "gpudra or gpudra-node binary to run (default: build ./cmd/gpudra-node)")
	fs.StringVar(&o.WorkDir, "work-dir", "/tmp", "directory for the trials (keep it short: unix socket paths)")
	fs.BoolVar(&o.Keep, "keep", false, "keep the directories and plugin logs of failing trials")
	fs.BoolVar(&o.Trace, "trace", false, "print every call, outcome and kill")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *seed >= 0 {
		o.Seed, o.Replay, o.Keep = uint64(*seed), true, true
		trialsSet := false
		fs.Visit(func(f *flag.Flag) { trialsSet = trialsSet || f.Name == "trials" })
		if !trialsSet {
			o.Trials = 1
		}
	}
	o.Out, o.ReplayCommand = stdout, replay
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if setUp != nil {
		api, done, err := setUp(ctx, &o)
		if err != nil {
			fmt.Fprintln(stderr, "chaos:", err)
			return 2
		}
		defer func() {
			if err := done(); err != nil {
				fmt.Fprintln(stderr, "chaos:", err)
			}
		}()
		o.API = api
	}
	sum, err := Run(ctx, o)
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		if sum != nil {
			fmt.Fprintln(stdout, sum.Line())
		}
		return 2
	}
	if len(sum.Violations) > 0 {
		return 1
	}
	return 0
}
