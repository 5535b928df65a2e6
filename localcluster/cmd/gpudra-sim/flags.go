package main

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/gpudra/gpudra/pkg/simfleet"

	"github.com/gpudra/gpudra/localcluster/controlplane"
	"github.com/gpudra/gpudra/localcluster/loadrun"
	"github.com/gpudra/gpudra/localcluster/uprun"
)

// invocation is what a command line asks for: the command, the options of
// its run and the components' logging.
type invocation struct {
	command string // "up" or "load"
	up      uprun.Options
	load    loadrun.Options
	log     logging
	// featureGates is up's --feature-gates, parsed into up.FeatureGates.
	featureGates string
}

// logging is where the components' logs go.
type logging struct {
	file      string
	verbosity int
}

const usage = `Usage: gpudra-sim COMMAND [flags]

Runs gpudra on a local Kubernetes cluster in this process: an in-process
control plane and simulated GPU nodes, each with gpudra's kubelet plugin.

Commands:
  up    start a cluster of a simulated fleet, apply manifests (by default
        the repository's examples), wait until the pods settle and print
        where each landed and what its containers got
  load  measure how fast pods with claims start with gpudra against a
        baseline driver on the same simulated 8-GPU nodes (minutes; not for CI)

Run gpudra-sim COMMAND -h for the command's flags.
`

const upUsage = `Usage: gpudra-sim up [flags]

Runs a local Kubernetes cluster in this process with simulated GPU nodes and
gpudra, installed from its Helm chart (deployments/helm/gpudra) with the
values of --chart-values, applies the manifests, waits until the pods and
workloads settle and prints where each pod landed and what its containers got
(CDI devices, device nodes, environment, mounts, MPS caps, time slices), the
workloads, and the objects the API server refused. On a fleet with NVLink
fabric nodes (e.g. gb200-nvl72) the chart's ComputeDomain driver runs too,
each node's channel plugin supervising a fake nvidia-imex. With --real-nodes N
the fleet's first N nodes are real: the kubelet, containerd and runc, gpudra's
own container, and a probe pod whose container prints what it sees. Exit
status 1 if the cluster did not start, an object was refused or the pods did
not settle; the report is printed (and written) in the last two cases too.

Flags:
`

const loadUsage = `Usage: gpudra-sim load [flags]

Starts a fleet of simulated 8-GPU nodes that run gpudra's plugin and a
baseline driver side by side, measures what the idle fleet costs, then creates
--pods pods with one-device claims in rounds that alternate the two drivers,
checks every round's outcome, and reports the makespans, CPU per pod, each
driver's own CPU and the API requests per pod (docs/design/performance.md). Not for CI.

Flags:
`

// newInvocation returns an invocation with the flags' defaults.
func newInvocation(command string) *invocation {
	return &invocation{command: command, up: uprun.DefaultOptions(), load: loadrun.DefaultOptions(0)}
}

// flagSet returns the command's flags, bound to inv's options, with its
// usage written to out.
func (inv *invocation) flagSet(out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("gpudra-sim "+inv.command, flag.ContinueOnError)
	fs.SetOutput(out)
	text := upUsage
	if inv.command == "load" {
		text = loadUsage
	}
	fs.Usage = func() {
		fmt.Fprint(out, text)
		fs.PrintDefaults()
	}
	if inv.command == "load" {
		o := &inv.load
		fs.IntVar(&o.Pods, "pods", o.Pods, "how many pods each round creates at once (required)")
		fs.IntVar(&o.Nodes, "nodes", o.Nodes, "number of simulated 8-GPU nodes")
		fs.StringVar(&o.Mix, "mix", o.Mix, "what the pods ask for: gpu (one whole GPU each) or mixed (a third a 1g.10gb dynamic MIG device, a tenth a share of a GPU, the rest a whole GPU)")
		fs.StringVar(&o.MIGMode, "mig-mode", o.MIGMode, "with --mix gpu: dynamic runs every node's plugin with --mig-mode=dynamic --mig-mode-switching (each H100 offered whole and as every MIG placement, about 25 devices), static with --mig-mode=static (one device per GPU); empty: the plugin's default, which offers GPUs not in MIG mode whole only")
		fs.IntVar(&o.Rounds, "rounds", o.Rounds, "how many rounds of each driver, alternating (the baseline's first)")
		fs.DurationVar(&o.RoundTimeout, "round-timeout", o.RoundTimeout, "how long each round may take to have every pod Running, and its pods to be deleted")
		fs.StringVar(&o.BaselineDriver, "baseline-driver", o.BaselineDriver, "the baseline driver's name; the scheduler searches a node's devices in the order of their drivers' names, so one that sorts after gpu.nvidia.com (e.g. sim.baseline.gpudra) puts the baseline's devices after gpudra's")
		fs.StringVar(&o.Dir, "dir", o.Dir, "directory for the cluster's state (default: /dev/shm if writable, else the temporary directory)")
		fs.StringVar(&o.CPUProfile, "cpu-profile", o.CPUProfile, "write a CPU profile of gpudra's last round to this file")
		fs.StringVar(&o.CPUProfileBaseline, "cpu-profile-baseline", o.CPUProfileBaseline, "write a CPU profile of the baseline driver's last round to this file")
		fs.StringVar(&o.CPUProfileIdle, "cpu-profile-idle", o.CPUProfileIdle, "write the CPU profile of the idle fleet (15 s before the rounds) to this file")
	} else {
		o := &inv.up
		fs.StringVar(&o.Fleet, "fleet", o.Fleet, "simulated fleet: a built-in name ("+fmt.Sprint(simfleet.BuiltinNames())+") or a fleet YAML file")
		fs.StringVar(&o.ChartValues, "chart-values", o.ChartValues, "values file (YAML) for gpudra's Helm chart, as helm install -f; the chart's flags, RBAC, policy and webhook are what the cluster runs")
		fs.StringVar(&o.Manifests, "manifests", o.Manifests, "directory (or file) of YAML manifests to apply (default: the repository's examples/)")
		fs.StringVar(&o.Events, "events", o.Events, "YAML list of GPU health events to inject after the apply: {after: <duration>, node: <name>, gpu: <index>, event: xid:<n>|ecc-dbe|gpu-lost|recover}")
		fs.StringVar(&o.Report, "report", o.Report, "write a JSON report of the pods to this file")
		fs.BoolVar(&o.KeepRunning, "keep-running", o.KeepRunning, "keep the cluster running after the report, until interrupted, and write a kubeconfig")
		fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "with --keep-running: where to write the kubeconfig")
		fs.DurationVar(&o.SettleTimeout, "settle-timeout", o.SettleTimeout, "how long to wait for the pods to settle")
		fs.IntVar(&o.RealNodes, "real-nodes", o.RealNodes, "make the fleet's first N nodes real: the real kubelet, containerd and runc, gpudra installed from the chart as a container of its image, and a probe pod whose container prints what it sees (docs/development/real-node.md); where the machine cannot run one, say what is missing and run without it")
		fs.StringVar(&o.FleetView, "fleet-view", o.FleetView, "serve the fleet view page (as gpudra fleet-view) of the local cluster on this address, e.g. 127.0.0.1:8090, while the cluster runs (with --keep-running until interrupted)")
		oldest, newest, _ := controlplane.VersionRange()
		fs.StringVar(&o.KubernetesVersion, "kubernetes-version", o.KubernetesVersion, fmt.Sprintf("the Kubernetes minor version the control plane, scheduler, controllers and simulated kubelets behave as, %s to %s (Kubernetes' compatibility-version emulation: that version's APIs and feature-gate defaults; docs/guides/install.md has what gpudra does on each); default %s", oldest, newest, newest))
		fs.StringVar(&inv.featureGates, "feature-gates", inv.featureGates, "feature gates to override at that version, as on every Kubernetes component: NAME=true|false,...")
	}
	fs.StringVar(&inv.log.file, "log-file", inv.log.file, "write the components' logs to this file (default: discard them)")
	fs.IntVar(&inv.log.verbosity, "v", inv.log.verbosity, "log verbosity of the components (with --log-file)")
	return fs
}

// parse parses a command line (without the program's name). Usage and
// errors go to stderr; -h gives flag.ErrHelp.
func parse(args []string, stderr io.Writer) (*invocation, error) {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") && !isHelp(args[0]) {
		return parseDeprecated(args, stderr)
	}
	switch args[0] {
	case "up", "load":
		return parseCommand(args[0], args[1:], stderr)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stderr, usage)
		return nil, flag.ErrHelp
	}
	fmt.Fprint(stderr, usage)
	return nil, fmt.Errorf("unknown command %q: want up or load", args[0])
}

func isHelp(arg string) bool { return arg == "-h" || arg == "-help" || arg == "--help" }

// parseCommand parses the flags of command.
func parseCommand(command string, args []string, stderr io.Writer) (*invocation, error) {
	inv := newInvocation(command)
	fs := inv.flagSet(stderr)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%s: unexpected arguments %v", command, fs.Args())
	}
	if command == "load" && inv.load.Pods <= 0 {
		return nil, fmt.Errorf("load: --pods %d: want 1 or more", inv.load.Pods)
	}
	if inv.featureGates != "" {
		gates, err := controlplane.ParseFeatureGates(inv.featureGates)
		if err != nil {
			return nil, fmt.Errorf("--feature-gates: %w", err)
		}
		inv.up.FeatureGates = gates
	}
	return inv, nil
}

// renamed are the flags of the form without a command that the load
// command names without their load- prefix; --load N was the load run.
var renamed = map[string]string{
	"load": "pods", "load-nodes": "nodes", "load-mix": "mix", "load-rounds": "rounds",
	"load-round-timeout": "round-timeout", "load-baseline-driver": "baseline-driver", "load-dir": "dir",
}

// parseDeprecated parses the flags without a command of the release
// before the commands: up's and load's in one set, load's with their old
// names. It says which command to use instead and parses that: --load N
// is load, else up, and a flag of the other command is ignored, as it
// was.
func parseDeprecated(args []string, stderr io.Writer) (*invocation, error) {
	old := flag.NewFlagSet("gpudra-sim", flag.ContinueOnError)
	old.SetOutput(stderr)
	old.Usage = func() { fmt.Fprint(stderr, usage) }
	oldName := map[string]string{}
	for k, v := range renamed {
		oldName[v] = k
	}
	for _, command := range []string{"up", "load"} {
		newInvocation(command).flagSet(io.Discard).VisitAll(func(f *flag.Flag) {
			name := f.Name
			if command == "load" && oldName[name] != "" {
				name = oldName[name]
			}
			if old.Lookup(name) == nil {
				old.Var(f.Value, name, f.Usage)
			}
		})
	}
	if err := old.Parse(args); err != nil {
		return nil, err
	}
	if old.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %v", old.Args())
	}
	command := "up"
	if old.Lookup("load").Value.String() != "0" {
		command = "load"
	}
	flags := newInvocation(command).flagSet(io.Discard)
	var newArgs, shown []string
	old.Visit(func(f *flag.Flag) {
		name := f.Name
		if renamed[name] != "" {
			name = renamed[name]
		}
		if flags.Lookup(name) == nil {
			return
		}
		v := f.Value.String()
		newArgs = append(newArgs, "--"+name+"="+v)
		switch {
		case v == "true" && isBool(f.Value):
			shown = append(shown, "--"+name)
		case v == "" || strings.ContainsAny(v, " \t\"'\\$"):
			shown = append(shown, "--"+name, strconv.Quote(v))
		default:
			shown = append(shown, "--"+name, v)
		}
	})
	what := "flags without a subcommand are"
	if len(args) == 0 {
		what = "running without a subcommand is"
	}
	fmt.Fprintf(stderr, "gpudra-sim: %s deprecated and will be removed in the next release; use: %s\n", what, strings.Join(append([]string{"gpudra-sim", command}, shown...), " "))
	return parseCommand(command, newArgs, stderr)
}

// isBool says whether v is a boolean flag's value.
func isBool(v flag.Value) bool {
	b, ok := v.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}
