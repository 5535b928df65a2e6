// Package chaos is gpudra's chaos run: a real `gpudra kubelet-plugin`
// process on a simulated node whose hardware outlives it, driven by a
// harness that is the kubelet (DRA gRPC calls, retries), the scheduler
// (allocations from the published slices with the scheduler's own
// allocator) and the API server (package apiserver, behind a proxy that
// can cut it), while the plugin is SIGKILLed at random moments. After
// every kill and at the end of each trial the node is checked against
// the driver's invariants (invariants.go). docs/development/chaos.md says what is run
// and how to replay a failing trial.
package chaos

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpudra/gpudra/internal/cutproxy"
	"github.com/gpudra/gpudra/internal/mpsfake"
)

// Options configure a run.
type Options struct {
	// Trials is how many trials run; trial i uses seed Seed+i.
	Trials int
	// Seed is the first trial's seed.
	Seed uint64
	// Replay runs every trial with Seed: a trial's decisions follow from
	// its seed, but when a kill lands depends on timing, so a failure
	// that depends on it may take a few replays.
	Replay bool
	// Steps is how many rounds of kubelet calls a trial makes.
	Steps int
	// KillProbability is the chance that the plugin is killed during a
	// round; MaxKillDelay bounds how long after the round's calls went
	// out.
	KillProbability float64
	MaxKillDelay    time.Duration
	// Outage, if set, cuts the API server for this long in the trials
	// whose seed is a multiple of OutageEvery.
	Outage      time.Duration
	OutageEvery int
	// LossProbability is the chance that the checkpoint is lost (deleted,
	// replaced by a dangling symlink, truncated) before a restart;
	// StaleProbability that a round allocates a claim to devices a running
	// claim holds; RollingProbability that a round is a rolling update.
	LossProbability, StaleProbability, RollingProbability float64
	// CallTimeout is the kubelet's DRA call timeout (and the plugin's
	// --kubelet-call-timeout).
	CallTimeout time.Duration
	// Binary is a gpudra binary to run; empty builds one.
	Binary string
	// WorkDir holds the trials' directories (short: unix socket paths);
	// default /tmp.
	WorkDir string
	// Keep keeps the directories of failing trials (with the plugin's
	// logs) for inspection.
	Keep bool
	// Out gets a line per trial and the summary; nil discards them.
	Out io.Writer
	// Trace writes every call, outcome and kill of the trials to Out.
	Trace bool
	// API gives each trial the API server the plugin talks to; nil: a
	// package apiserver server of its own. The local cluster's module
	// passes its real etcd and kube-apiserver (docs/development/chaos.md).
	API APIServerFactory
	// ReplayCommand is the command that replays a failing seed, with %d
	// for the seed; empty: `make chaos`'s.
	ReplayCommand string
}

// ShortOptions are the options of the short form that `go test` runs.
func ShortOptions() Options {
	return Options{
		Trials: 6, Seed: 1, Steps: 5, KillProbability: 0.6, MaxKillDelay: 150 * time.Millisecond,
		Outage: 3 * time.Second, OutageEvery: 6, CallTimeout: 45 * time.Second, // an outage in the trial of seed 6
		// Higher than the long form's, so that 30 rounds have each class.
		LossProbability: 0.4, StaleProbability: 0.3, RollingProbability: 0.25,
	}
}

// LongOptions are the options of `make chaos`.
func LongOptions() Options {
	return Options{
		Trials: 1000, Seed: 1, Steps: 12, KillProbability: 0.6, MaxKillDelay: 200 * time.Millisecond,
		Outage: 30 * time.Second, OutageEvery: 100, CallTimeout: 45 * time.Second,
		LossProbability: 0.15, StaleProbability: 0.2, RollingProbability: 0.12,
	}
}

// Summary is what a run found.
type Summary struct {
	Trials int
	// Violations are the invariant violations, each with its trial's
	// seed; FailedSeeds the seeds of the trials that had any.
	Violations  []string
	FailedSeeds []uint64
	// Claims counts the claims allocated, by kind; Prepared those that
	// got prepared at least once.
	Claims, Prepared map[kind]int
	// Kills, Calls, TransportErrors (calls cut by a kill or timed out),
	// ClaimErrors (per-claim errors: refusals, conflicts) and their
	// most frequent messages.
	Kills, Restarts, Calls, TransportErrors, ClaimErrors int
	ForcedDeletions, GivenUp, NoFit                      int
	ErrorMessages                                        map[string]int
	// Damages counts the checkpoints damaged while the plugin was down, by
	// damage; AdoptionKills the kills in the start after one.
	Damages       map[damage]int
	AdoptionKills int
	// StaleClaims are the claims allocated to devices a running claim
	// holds (stale.go); RollingUpdates the second instances started beside
	// the plugin, RacedPairs the claims prepared through one instance and
	// unprepared through the other at once, and UnprepareLast those of
	// them whose Unprepare succeeded after the Prepare returned
	// (rolling.go).
	StaleClaims, RollingUpdates, RacedPairs, UnprepareLast int
	Outages                                                []OutageFigures
	Duration                                               time.Duration
}

// OutageFigures is what one API outage did.
type OutageFigures struct {
	Seed     uint64
	Mode     cutproxy.Mode
	Duration time.Duration
	// PrepareErrors are the Prepare attempts that failed during the
	// outage (per-claim errors and calls that timed out), with a sample.
	PrepareErrors, PrepareTimeouts int
	ErrorSample                    string
	// PrepareRecovery is how long after the API came back the plugin
	// first answered a Prepare held up by the outage for the claim itself
	// (prepared, or refused for a reason of its own); SliceRecovery how long
	// until the API server had the node's complete pool again (it was
	// deleted during the outage, as the kubelet deletes the slices of a
	// plugin that went away, and the plugin restarted without the API).
	PrepareRecovery, SliceRecovery time.Duration
}

// Line is the summary's last line, which scripts check.
func (s *Summary) Line() string {
	return fmt.Sprintf("chaos: %d trials, %d invariant violations", s.Trials, len(s.Violations))
}

// Run runs the trials.
func Run(ctx context.Context, o Options) (*Summary, error) {
	if o.CallTimeout <= 0 || o.Steps <= 0 {
		return nil, fmt.Errorf("chaos: CallTimeout %v and Steps %d must be positive", o.CallTimeout, o.Steps)
	}
	out := o.Out
	if out == nil {
		out = io.Discard
	}
	if o.WorkDir == "" {
		o.WorkDir = "/tmp"
	}
	work, err := os.MkdirTemp(o.WorkDir, "gc")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(work) }()
	if o.Binary == "" {
		start := time.Now()
		if o.Binary, err = buildBinary(ctx, work); err != nil {
			return nil, err
		}
		fmt.Fprintf(out, "chaos: built gpudra (race detector %v) in %v\n", raceEnabled, time.Since(start).Round(time.Second))
	}
	mpsBin, cleanup, err := mpsfake.SetUp()
	if err != nil {
		return nil, fmt.Errorf("fake MPS control binary: %w (the program must call mpsfake.Main first)", err)
	}
	defer cleanup()
	sum := &Summary{Claims: map[kind]int{}, Prepared: map[kind]int{}, ErrorMessages: map[string]int{}, Damages: map[damage]int{}}
	start := time.Now()
	for i := range o.Trials {
		if ctx.Err() != nil {
			// Interrupted: the figures of the trials that ran.
			fmt.Fprintf(out, "chaos: interrupted after %d of %d trials\n", sum.Trials, o.Trials)
			break
		}
		seed := o.Seed + uint64(i)
		if o.Replay {
			seed = o.Seed
		}
		// By seed, so that a replay has the outage its trial had.
		outage := o.Outage > 0 && o.OutageEvery > 0 && seed%uint64(o.OutageEvery) == 0
		// Short: MPS pipe directories under it must fit unix socket
		// paths (mps.MaxPipeDirLength).
		dir := filepath.Join(work, fmt.Sprintf("%d-%d", seed, i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			return sum, err
		}
		t := newTrial(seed, &o, dir, filepath.Join(mpsBin, mpsfake.ControlName), sum)
		tStart := time.Now()
		err = t.run(ctx, outage)
		if ctx.Err() != nil {
			_ = os.RemoveAll(dir)
			fmt.Fprintf(out, "chaos: interrupted during trial %d (seed %d), which does not count\n", i+1, seed)
			break
		}
		sum.Trials++
		if err != nil {
			t.violate("harness: %v", err)
		}
		status := "ok"
		if len(t.violations) > 0 {
			status = fmt.Sprintf("%d VIOLATIONS", len(t.violations))
			sum.FailedSeeds = append(sum.FailedSeeds, seed)
			for _, v := range t.violations {
				sum.Violations = append(sum.Violations, fmt.Sprintf("seed %d: %s", seed, v))
				fmt.Fprintf(out, "chaos: seed %d: %s\n", seed, v)
			}
			if o.Keep {
				kept := filepath.Join(o.WorkDir, fmt.Sprintf("gchaos-failed-%d", seed))
				_ = os.RemoveAll(kept)
				if err := os.Rename(dir, kept); err == nil {
					fmt.Fprintf(out, "chaos: seed %d: directories and plugin logs kept in %s\n", seed, kept)
				}
			}
			if o.ReplayCommand != "" {
				fmt.Fprintf(out, "chaos: replay with %s\n", fmt.Sprintf(o.ReplayCommand, seed))
			} else {
				fmt.Fprintf(out, "chaos: replay with make chaos CHAOS_ARGS='-seed %d -trials 5' (or GPUDRA_CHAOS_SEED=%d go test -run TestChaos ./internal/chaos)\n", seed, seed)
			}
		}
		_ = os.RemoveAll(dir)
		fmt.Fprintf(out, "chaos: trial %d/%d seed %d (%s, %d claims, %d kills%s) %v: %s\n", i+1, o.Trials, seed, t.n.profile,
			t.claims, t.kills, map[bool]string{true: ", API outage", false: ""}[outage], time.Since(tStart).Round(10*time.Millisecond), status)
	}
	sum.Duration = time.Since(start)
	sum.report(out)
	return sum, nil
}

// report prints the figures; the last line is Line.
func (s *Summary) report(w io.Writer) {
	fmt.Fprintf(w, "chaos: %v for %d trials; %d kills, %d restarts, %d DRA calls (%d cut by a kill or timed out), %d per-claim errors\n",
		s.Duration.Round(time.Second), s.Trials, s.Kills, s.Restarts, s.Calls, s.TransportErrors, s.ClaimErrors)
	var kinds []string
	for _, k := range slices.Sorted(maps.Keys(s.Claims)) {
		kinds = append(kinds, fmt.Sprintf("%s %d (%d prepared)", k, s.Claims[k], s.Prepared[k]))
	}
	fmt.Fprintf(w, "chaos: claims: %s; %d forced deletions, %d given up, %d found no fit\n", strings.Join(kinds, ", "), s.ForcedDeletions, s.GivenUp, s.NoFit)
	var ds []string
	for _, d := range damages {
		ds = append(ds, fmt.Sprintf("%s %d", d, s.Damages[d]))
	}
	fmt.Fprintf(w, "chaos: checkpoints lost while the plugin was down: %s; %d kills in the start after; %d stale allocations to held devices; %d rolling updates, %d claims prepared and unprepared through two instances at once (%d unprepared last)\n",
		strings.Join(ds, ", "), s.AdoptionKills, s.StaleClaims, s.RollingUpdates, s.RacedPairs, s.UnprepareLast)
	type msg struct {
		text string
		n    int
	}
	var msgs []msg
	for text, n := range s.ErrorMessages {
		msgs = append(msgs, msg{text, n})
	}
	slices.SortFunc(msgs, func(a, b msg) int { return b.n - a.n })
	for i, m := range msgs {
		if i == 8 {
			break
		}
		fmt.Fprintf(w, "chaos: per-claim error x%d: %s\n", m.n, m.text)
	}
	for _, o := range s.Outages {
		fmt.Fprintf(w, "chaos: outage (seed %d, %s, %v): %d Prepare errors and %d calls without an answer (killed or hung) during it (e.g. %q); Prepare answered again %v after the API came back, complete pool %v after\n",
			o.Seed, o.Mode, o.Duration, o.PrepareErrors, o.PrepareTimeouts, o.ErrorSample, o.PrepareRecovery.Round(10*time.Millisecond), o.SliceRecovery.Round(10*time.Millisecond))
	}
	if len(s.FailedSeeds) > 0 {
		fmt.Fprintf(w, "chaos: failing seeds: %v\n", s.FailedSeeds)
	}
	fmt.Fprintln(w, s.Line())
}
