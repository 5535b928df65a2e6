// Package loadrun is the local cluster's load run (gpudra-sim load): it
// starts a fleet of simulated 8-GPU nodes that run gpudra's plugin and the
// baseline driver (package baseline) side by side, measures what the idle
// fleet costs, then creates pods with one-device claims in rounds that
// alternate the two drivers, checks every round's outcome, and reports
// the makespans, CPU per pod, each driver's own CPU and the API requests
// per pod. docs/design/performance.md holds its figures.
package loadrun

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/controlplane"
)

// Defaults of the options (and of gpudra-sim load's flags).
const (
	// DefaultNodes is the number of simulated nodes.
	DefaultNodes = 100
	// DefaultRoundTimeout bounds each round, and the deletion after it.
	DefaultRoundTimeout = 10 * time.Minute
)

// Options configure a load run. Errors about them name them by
// gpudra-sim load's flags, given here with each; DefaultOptions has the flags'
// defaults. Zero values are refused where the flag's would be, not
// replaced by the default.
type Options struct {
	// Pods is how many pods each round creates at once (--pods).
	Pods int
	// Nodes is the number of simulated nodes of 8 H100 (--nodes).
	Nodes int
	// Mix is what the pods ask for: "gpu" or "mixed" (--mix; see
	// MixGPU and MixMixed).
	Mix string
	// MIGMode is how the nodes' plugins offer MIG (--mig-mode): empty as
	// the mix has it; MIGModeDynamic, every GPU whole and as every MIG
	// placement (--mig-mode=dynamic --mig-mode-switching: about 25
	// devices per H100); MIGModeStatic, the MIG devices that exist (none:
	// one device per GPU). With --mix gpu the two measure what the
	// scheduler pays for dynamic MIG's devices.
	MIGMode string
	// Rounds is how many rounds of each driver run, alternating, the
	// baseline's first (--rounds).
	Rounds int
	// RoundTimeout bounds each round until every pod is Running, and the
	// deletion of its pods after it (--round-timeout).
	RoundTimeout time.Duration
	// BaselineDriver is the baseline driver's name and that of its
	// DeviceClass (--baseline-driver).
	BaselineDriver string
	// Dir is where a new directory holds the cluster's state, removed at
	// the end (--dir); empty: DefaultDir().
	Dir string
	// CPUProfile, CPUProfileBaseline and CPUProfileIdle, if set, are the
	// files the CPU profiles of gpudra's last round, the baseline's last
	// round and the idle fleet are written to (--cpu-profile,
	// --cpu-profile-baseline, --cpu-profile-idle); Result holds them too.
	CPUProfile, CPUProfileBaseline, CPUProfileIdle string
	// Out gets the report: the idle fleet's cost before the rounds, the
	// comparison after them. Nil: os.Stdout.
	Out io.Writer
	// Progress, if set, gets one line per step.
	Progress func(msg string)
	// AroundStop, if set, is called with the function that stops the
	// cluster, and must call it (gpudra-sim silences the API server's
	// etcd client, which complains about every request the stop cancels).
	AroundStop func(stop func())
}

// The MIG modes of Options.MIGMode.
const (
	MIGModeDynamic = "dynamic"
	MIGModeStatic  = "static"
)

// DefaultOptions returns the options of gpudra-sim load's flag defaults, for
// pods pods.
func DefaultOptions(pods int) Options {
	return Options{
		Pods:           pods,
		Nodes:          DefaultNodes,
		Mix:            string(MixGPU),
		Rounds:         DefaultRounds,
		RoundTimeout:   DefaultRoundTimeout,
		BaselineDriver: DefaultBaselineDriver,
	}
}

// Result is what a load run measured.
type Result struct {
	// Fleet is what the idle started fleet cost.
	Fleet *FleetCost
	// Baseline and Gpudra are each driver's rounds, in the order they ran.
	Baseline, Gpudra []*Round
}

// runner is one load run.
type runner struct {
	o   Options
	mix Mix
	out io.Writer
}

func (lr *runner) progress(format string, args ...any) {
	if lr.o.Progress != nil {
		lr.o.Progress(fmt.Sprintf(format, args...))
	}
}

// Run measures how fast pods with one-device claim templates go from
// creation to prepared-and-running with gpudra, against the same pods and
// claims served by the baseline driver (package baseline) on the same
// nodes, in alternating rounds (compare.go). It refuses options it cannot
// honour before it starts a cluster, and fails when a round's pods do not
// all run in time or its check finds a pod without its own device.
func Run(ctx context.Context, o Options) (*Result, error) {
	mix, err := ParseMix(o.Mix)
	if err != nil {
		return nil, err
	}
	if o.RoundTimeout <= 0 {
		return nil, fmt.Errorf("--round-timeout %v: must be positive", o.RoundTimeout)
	}
	if o.Rounds < 1 {
		return nil, fmt.Errorf("--rounds %d: must be at least 1", o.Rounds)
	}
	if err := mix.fits(o.Pods, o.Nodes); err != nil {
		return nil, err
	}
	switch {
	case o.MIGMode != "" && o.MIGMode != MIGModeDynamic && o.MIGMode != MIGModeStatic:
		return nil, fmt.Errorf("--mig-mode %q: must be %s or %s (or empty)", o.MIGMode, MIGModeDynamic, MIGModeStatic)
	case o.MIGMode != "" && mix != MixGPU:
		return nil, fmt.Errorf("--mig-mode %s: only with --mix %s (the mixed fleet lays out its own MIG GPUs)", o.MIGMode, MixGPU)
	}
	if err := checkBaselineName(o.BaselineDriver); err != nil {
		return nil, err
	}
	fleet, err := mix.fleet(o.Nodes, o.MIGMode)
	if err != nil {
		return nil, err
	}
	lr := &runner{o: o, mix: mix, out: o.Out}
	if lr.out == nil {
		lr.out = os.Stdout
	}
	base := o.Dir
	if base == "" {
		base = DefaultDir()
	}
	dir, err := os.MkdirTemp(base, "gpudra-sim-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	// No MPS or IMEX daemons: the run measures the drivers, and its
	// shares are uncapped (mix.go).
	opts := cluster.Options{Fleet: fleet, Dir: dir, ControlPlane: controlplane.Options{}, Baseline: o.BaselineDriver, NoDaemons: true, Progress: o.Progress}
	lr.progress("starting the local cluster: %d nodes of 8 H100 (--mix %s), state in %s", o.Nodes, mix, dir)
	start := time.Now()
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return nil, err
	}
	defer func() {
		lr.progress("stopping the local cluster")
		stop := func() { _ = c.Stop() }
		if o.AroundStop != nil {
			o.AroundStop(stop)
		} else {
			stop()
		}
	}()
	started := time.Since(start)
	lr.progress("cluster ready in %v", started.Round(time.Millisecond))

	client, err := kubernetes.NewForConfig(c.ControlPlane().RESTConfig("gpudra-sim-load", creatorQPS, creatorBurst))
	if err != nil {
		return nil, err
	}
	cost, err := measureFleet(ctx, c.ControlPlane(), client, o.Nodes, started)
	if err != nil {
		return nil, fmt.Errorf("measure the idle fleet: %w", err)
	}
	cost.print(lr.out)
	if o.CPUProfileIdle != "" {
		if err := os.WriteFile(o.CPUProfileIdle, cost.IdleProfile, 0o644); err != nil {
			return nil, fmt.Errorf("--cpu-profile-idle: %w", err)
		}
	}
	res := &Result{Fleet: cost}
	if res.Baseline, res.Gpudra, err = lr.compareDrivers(ctx, c, client, base); err != nil {
		return nil, err
	}
	return res, nil
}

// DefaultDir is where the load run keeps the cluster's state: in
// memory (/dev/shm) where there is one. A hundred simulated nodes write
// their DRA manager checkpoints, gpudra's checkpoints and CDI specs, with
// fsync, to what on a real cluster are a hundred disks; on one shared
// disk the file creation and syncing of the claims round cost more CPU
// and time than the nodes' own work, which is not what the run measures.
// The files are still written and read back as on a real node.
func DefaultDir() string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if f, err := os.CreateTemp("/dev/shm", "gpudra-sim-probe-"); err == nil {
			f.Close()
			os.Remove(f.Name())
			return "/dev/shm"
		}
	}
	return os.TempDir()
}
