// Command gpudra-sim runs gpudra on a local cluster: an in-process control
// plane (etcd, kube-apiserver, kube-scheduler, the controllers) and
// simulated GPU nodes, each with gpudra's kubelet plugin and the kubelet's
// own DRA code. It applies manifests (by default the repository's
// examples), waits for the pods to settle and prints where each landed.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	sigsyaml "sigs.k8s.io/yaml"

	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/imex/imexfake"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/loadrun"
	"github.com/gpudra/gpudra/localcluster/manifests"
	"github.com/gpudra/gpudra/pkg/mps/mpsfake"
)

type options struct {
	fleet       string
	manifests   string
	report      string
	keepRunning bool
	kubeconfig  string
	logFile     string
	verbosity   int
	settle      time.Duration
	load        int
	loadNodes   int
	cpuProfile  string
	// cpuProfileBaseline profiles the load run's last baseline round.
	cpuProfileBaseline string
	// cpuProfileIdle is where the load run writes its idle fleet's profile.
	cpuProfileIdle string
	// loadDir is where the load run's cluster keeps its state.
	loadDir string
	// loadRoundTimeout bounds each load round, and the deletion after it.
	loadRoundTimeout time.Duration
	// loadMix is what the load run's pods ask for (loadrun.Options.Mix).
	loadMix string
	// loadRounds is how many rounds of each driver the load run makes.
	loadRounds int
	// loadBaseline is the baseline driver's name.
	loadBaseline string
	// events is a health events file to play after the apply.
	events string
	// chartValues is a values file for gpudra's chart.
	chartValues string
	// fleetView is where to serve the fleet view page (host:port).
	fleetView string
	// realNodes is how many of the fleet's first nodes are real.
	realNodes int
}

func main() {
	// Started as nvidia-cuda-mps-control, nvidia-imex or nvidia-imex-ctl
	// (links to this program that cluster.Start installs): run as the
	// simulated nodes' daemon.
	if code, ok := cluster.Main(); ok {
		os.Exit(code)
	}
	var o options
	fs := flag.NewFlagSet("gpudra-sim", flag.ExitOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: gpudra-sim [--fleet FILE|NAME] [--chart-values FILE] [--manifests DIR] [--events FILE] [--report FILE] [--keep-running] [--fleet-view ADDR] [--real-nodes N]

Runs a local Kubernetes cluster in this process with simulated GPU nodes and
gpudra, installed from its Helm chart (deployments/helm/gpudra) with the
values of --chart-values, applies the manifests, waits until the pods and workloads settle and
prints where each pod landed and what its containers got (CDI devices, device
nodes, environment, mounts, MPS caps, time slices), the workloads, and the
objects the API server refused. On a fleet with NVLink fabric nodes (e.g.
gb200-nvl72) the chart's ComputeDomain driver runs too, each node's channel
plugin supervising a fake nvidia-imex. With --real-nodes N the fleet's first N
nodes are real: the kubelet, containerd and runc, gpudra's own container, and a
probe pod whose container prints what it sees. Exit status 1 if the cluster did not start,
an object was refused or the pods did not settle; the report is printed (and
written) in the last two cases too.

Flags:
`)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.fleet, "fleet", "demo", "simulated fleet: a built-in name ("+fmt.Sprint(sim.BuiltinNames())+") or a fleet YAML file")
	fs.StringVar(&o.chartValues, "chart-values", "", "values file (YAML) for gpudra's Helm chart, as helm install -f; the chart's flags, RBAC, policy and webhook are what the cluster runs")
	fs.StringVar(&o.manifests, "manifests", "", "directory (or file) of YAML manifests to apply (default: the repository's examples/)")
	fs.StringVar(&o.events, "events", "", "YAML list of GPU health events to inject after the apply: {after: <duration>, node: <name>, gpu: <index>, event: xid:<n>|ecc-dbe|gpu-lost|recover}")
	fs.StringVar(&o.report, "report", "", "write a JSON report of the pods to this file")
	fs.BoolVar(&o.keepRunning, "keep-running", false, "keep the cluster running after the report, until interrupted, and write a kubeconfig")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "gpudra-sim.kubeconfig", "with --keep-running: where to write the kubeconfig")
	fs.StringVar(&o.logFile, "log-file", "", "write the components' logs to this file (default: discard them)")
	fs.IntVar(&o.verbosity, "v", 0, "log verbosity of the components (with --log-file)")
	fs.DurationVar(&o.settle, "settle-timeout", 3*time.Minute, "how long to wait for the pods to settle")
	fs.IntVar(&o.load, "load", 0, "instead of the manifests: a load run with this many pods (see --load-nodes); not for CI")
	fs.IntVar(&o.loadNodes, "load-nodes", loadrun.DefaultNodes, "with --load: number of simulated 8-GPU nodes")
	fs.StringVar(&o.cpuProfile, "cpu-profile", "", "with --load: write a CPU profile of gpudra's last round to this file")
	fs.DurationVar(&o.loadRoundTimeout, "load-round-timeout", loadrun.DefaultRoundTimeout, "with --load: how long each round may take to have every pod Running, and its pods to be deleted")
	fs.IntVar(&o.loadRounds, "load-rounds", loadrun.DefaultRounds, "with --load: how many rounds of each driver, alternating (the baseline's first)")
	fs.StringVar(&o.loadMix, "load-mix", string(loadrun.MixGPU), "with --load: what the pods ask for: gpu (one whole GPU each) or mixed (a third a 1g.10gb dynamic MIG device, a tenth a share of a GPU, the rest a whole GPU)")
	fs.StringVar(&o.loadBaseline, "load-baseline-driver", loadrun.DefaultBaselineDriver, "with --load: the baseline driver's name; the scheduler searches a node's devices in the order of their drivers' names, so one that sorts after gpu.nvidia.com (e.g. sim.baseline.gpudra) puts the baseline's devices after gpudra's")
	fs.StringVar(&o.loadDir, "load-dir", "", "with --load: directory for the cluster's state (default: /dev/shm if writable, else the temporary directory)")
	fs.IntVar(&o.realNodes, "real-nodes", 0, "make the fleet's first N nodes real: the real kubelet, containerd and runc, gpudra installed from the chart as a container of its image, and a probe pod whose container prints what it sees (docs/real-node.md); where the machine cannot run one, say what is missing and run without it")
	fs.StringVar(&o.fleetView, "fleet-view", "", "serve the fleet view page (as gpudra fleet-view) of the local cluster on this address, e.g. 127.0.0.1:8090, while the cluster runs (with --keep-running until interrupted)")
	fs.StringVar(&o.cpuProfileBaseline, "cpu-profile-baseline", "", "with --load: write a CPU profile of the baseline driver's last round to this file")
	fs.StringVar(&o.cpuProfileIdle, "cpu-profile-idle", "", "with --load: write the CPU profile of the idle fleet (15 s before the rounds) to this file")
	_ = fs.Parse(os.Args[1:])
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "gpudra-sim: unexpected arguments %v\n", fs.Args())
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gpudra-sim:", err)
		os.Exit(1)
	}
}

// setUpLogging sends klog's output (every component logs through it) to
// the log file, or nowhere: the progress lines and the table are for the
// user, the components' chatter is not.
func setUpLogging(o options) (func(), error) {
	kfs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(kfs)
	// one_output: klog writes an error to the error, warning and info
	// outputs, which SetOutput makes one file: each line would be there
	// three times.
	for k, v := range map[string]string{"logtostderr": "false", "alsologtostderr": "false", "stderrthreshold": "FATAL", "one_output": "true", "v": fmt.Sprint(o.verbosity)} {
		if err := kfs.Set(k, v); err != nil {
			return nil, err
		}
	}
	// The standard logger's too: Helm's chart loader and the webhook's
	// HTTP server log through it.
	if o.logFile == "" {
		klog.SetOutput(io.Discard)
		log.SetOutput(io.Discard)
		return func() {}, nil
	}
	f, err := os.Create(o.logFile)
	if err != nil {
		return nil, err
	}
	klog.SetOutput(f)
	log.SetOutput(f)
	return func() { klog.Flush(); f.Close() }, nil
}

// stderr is where progress goes: the original standard error, which
// quietStderr leaves alone.
var stderr io.Writer = os.Stderr

// quietStderr runs f with file descriptor 2 pointing to /dev/null. The
// API server's etcd client logs through a zap logger bound to fd 2 at
// init, with no way to turn it down, and complains about every request
// that shutting down cancels.
func quietStderr(f func()) {
	saved, err := syscall.Dup(2)
	if err != nil {
		f()
		return
	}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		syscall.Close(saved)
		f()
		return
	}
	_ = syscall.Dup2(int(null.Fd()), 2)
	defer func() {
		_ = syscall.Dup2(saved, 2)
		syscall.Close(saved)
		null.Close()
	}()
	f()
}

func progress(format string, args ...any) {
	fmt.Fprintf(stderr, "%s  %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// run runs the cluster as the options say, printing the table (and, with
// --keep-running, how to reach the cluster) to stdout.
func run(ctx context.Context, o options, stdout io.Writer) (finalErr error) {
	closeLog, err := setUpLogging(o)
	if err != nil {
		return err
	}
	defer closeLog()
	if o.load > 0 {
		return runLoad(ctx, o)
	}

	dir := o.manifests
	if dir == "" {
		if dir, err = findExamples(); err != nil {
			return err
		}
	}
	objs, err := manifests.Load(dir)
	if err != nil {
		return err
	}
	fleet, err := sim.Load(o.fleet)
	if err != nil {
		return err
	}
	var events []cluster.ScheduledHealthEvent
	if o.events != "" {
		if events, err = cluster.LoadHealthEvents(o.events); err != nil {
			return fmt.Errorf("--events: %w", err)
		}
		if err := cluster.CheckHealthEvents(events, fleet); err != nil {
			return fmt.Errorf("--events: %w", err)
		}
	}

	// The simulated daemons live as long as their claims (they are stopped
	// when their claims are unprepared, and killed when the cluster
	// stops), not the fakes' default bound.
	_ = os.Setenv(mpsfake.EnvMaxLifetime, "0")
	_ = os.Setenv(imexfake.EnvMaxLifetime, "0")

	values, err := readChartValues(o.chartValues)
	if err != nil {
		return err
	}
	var fleetView net.Listener
	if o.fleetView != "" {
		if fleetView, err = listenFleetView(o.fleetView); err != nil {
			return err
		}
		defer fleetView.Close()
	}
	progress("starting the local cluster: fleet %s, %d nodes", o.fleet, len(fleet.Nodes))
	start := time.Now()
	realNodes, err := prepareRealNodes(ctx, o, fleet, progress)
	if err != nil {
		return err
	}
	clusterOpts := cluster.Options{Fleet: fleet, ChartValues: values, RealNodes: realNodes, Progress: func(msg string) { progress("%s", msg) }}
	c, err := cluster.Start(ctx, clusterOpts)
	if err != nil && realNodes != nil && ctx.Err() == nil {
		// A real node depends on the machine in more ways than
		// prepareRealNodes can check; the simulated cluster does not.
		progress("real nodes: the cluster did not start with them (%v); starting it with simulated nodes only", err)
		clusterOpts.RealNodes = nil
		c, err = cluster.Start(ctx, clusterOpts)
	}
	if err != nil {
		return fmt.Errorf("start the local cluster: %w", err)
	}
	defer func() {
		progress("stopping the local cluster")
		stopping := time.Now()
		var err error
		quietStderr(func() { err = c.Stop() })
		if err != nil && finalErr == nil {
			finalErr = fmt.Errorf("stop the local cluster: %w", err)
		}
		progress("stopped in %v", time.Since(stopping).Round(time.Millisecond))
		if !o.keepRunning && ctx.Err() == nil {
			next := []string{"--keep-running keeps the cluster up for kubectl"}
			if o.events == "" {
				next = append(next, "--events FILE injects GPU faults")
			}
			if o.report == "" {
				next = append(next, "--report FILE writes the report as JSON")
			}
			progress("next: %s (gpudra-sim -h)", strings.Join(next, "; "))
		}
	}()
	progress("cluster ready in %v", time.Since(start).Round(time.Millisecond))
	if fleetView != nil {
		// Stopped before the cluster (defers run last first), so that
		// its watches do not outlive the API server.
		fleetViewCtx, stopFleetView := context.WithCancel(ctx)
		defer stopFleetView()
		url, err := serveFleetView(fleetViewCtx, c, fleetView)
		if err != nil {
			return err
		}
		progress("fleet view: %s", url)
	}

	probes, err := c.RealNodeProbes()
	if err != nil {
		return err
	}
	objs = append(objs, probes...)
	progress("applying %d objects from %s", len(objs), dir)
	applied := time.Now()
	refused, err := c.Apply(ctx, objs)
	if err != nil {
		return err
	}
	var eventErrs []error
	eventsDone := make(chan struct{})
	go func() {
		defer close(eventsDone)
		_ = c.RunHealthEvents(ctx, applied, events, func(e cluster.ScheduledHealthEvent, err error) {
			if err != nil {
				progress("health event: %v", err)
				eventErrs = append(eventErrs, err)
				return
			}
			progress("health event at +%v: %s on %s GPU %d (%s)", e.After, e.Event, e.Node, e.GPU, e.Source)
		})
	}()
	for _, r := range refused {
		progress("refused: %s", r)
	}
	// Pods: Running, Succeeded, or Pending with a reason; workloads: their
	// controllers made the pods they will make.
	progress("waiting for the pods and workloads to settle")
	settling := time.Now()
	settleCtx, cancel := context.WithTimeout(ctx, o.settle)
	settleErr := c.WaitSettled(settleCtx, 2*time.Second)
	cancel()
	if settleErr == nil {
		progress("settled in %v", time.Since(settling).Round(time.Millisecond))
	}
	if len(events) > 0 {
		// The report is of the cluster after the last event, settled
		// again (the plugin republishes taints within about a second;
		// settling waits 2 s of quiet).
		<-eventsDone
		progress("all %d health events applied; waiting for the cluster to settle again", len(events))
		settling := time.Now()
		settleCtx, cancel := context.WithTimeout(ctx, o.settle)
		settleErr = c.WaitSettled(settleCtx, 2*time.Second)
		cancel()
		if settleErr == nil {
			progress("settled in %v", time.Since(settling).Round(time.Millisecond))
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	report, err := c.Report(ctx)
	if err != nil {
		return err
	}
	report.Refused = append(report.Refused, refused...)
	fmt.Fprintln(stdout)
	printTable(stdout, report)
	more := "--report FILE lists every node's (nodes[].httpEndpoint)"
	if o.report != "" {
		more = "nodes[].httpEndpoint in " + o.report
	}
	if lines := cluster.PluginEndpointLines(report.Nodes, 3, more); len(lines) > 0 {
		fmt.Fprintln(stdout)
		for _, l := range lines {
			fmt.Fprintln(stdout, l)
		}
	}
	if o.report != "" {
		data, err := json.MarshalIndent(report, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.report, append(data, '\n'), 0o644); err != nil {
			return err
		}
		progress("report written to %s", o.report)
	}
	// The report comes first: what was refused or did not settle is in
	// it, and the rest is worth seeing all the same.
	var errs []error
	if len(refused) > 0 {
		errs = append(errs, fmt.Errorf("%d of %d objects refused by the API server (listed under REFUSED)", len(refused), len(objs)))
	}
	if settleErr != nil {
		errs = append(errs, fmt.Errorf("not settled within %v (--settle-timeout): %w", o.settle, settleErr))
	}
	errs = append(errs, eventErrs...)
	if o.keepRunning {
		if err := keepRunning(ctx, c, report, o, stdout); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// keepRunning writes a kubeconfig and waits for an interrupt.
func keepRunning(ctx context.Context, c *cluster.Cluster, report *cluster.Report, o options, stdout io.Writer) error {
	path, err := filepath.Abs(o.kubeconfig)
	if err != nil {
		return err
	}
	if err := c.ControlPlane().WriteKubeconfig(path); err != nil {
		return err
	}
	fmt.Fprintf(stdout, `
The cluster keeps running until you press Ctrl-C. To use it:

  export KUBECONFIG=%s
  kubectl get nodes
  kubectl get resourceslices
  kubectl get pods,resourceclaims -A
  kubectl logs -n NAMESPACE POD [-c CONTAINER]

`, path)
	for _, l := range cluster.ContainerAccessLines(report.Nodes) {
		fmt.Fprintln(stdout, l)
	}
	fmt.Fprintln(stdout)
	<-ctx.Done()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// findExamples looks for the repository's examples directory from the
// working directory: the repository root or the localcluster module.
func findExamples() (string, error) {
	for _, dir := range []string{"examples", filepath.Join("..", "examples")} {
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			return dir, nil
		}
	}
	return "", errors.New("no examples/ directory here or in the parent directory; give --manifests DIR")
}

// readChartValues reads a values file as helm install -f does; no file, no
// values.
func readChartValues(path string) (map[string]any, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--chart-values: %w", err)
	}
	values := map[string]any{}
	if err := sigsyaml.Unmarshal(data, &values); err != nil {
		return nil, fmt.Errorf("--chart-values %s: %w", path, err)
	}
	return values, nil
}
