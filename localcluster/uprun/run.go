// Package uprun is the local cluster's default run (gpudra-sim up): it
// starts a cluster of a simulated fleet with gpudra installed from its
// Helm chart, applies manifests (by default the repository's examples),
// plays GPU health events, waits until the pods and workloads settle and
// reports where each pod landed and what its containers got.
package uprun

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	sigsyaml "sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/pkg/simfleet"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/controlplane"
	"github.com/gpudra/gpudra/localcluster/manifests"
)

// Defaults of the options (and of gpudra-sim up's flags).
const (
	// DefaultFleet is the built-in fleet the cluster simulates.
	DefaultFleet = "demo"
	// DefaultKubeconfig is where KeepRunning writes the kubeconfig.
	DefaultKubeconfig = "gpudra-sim.kubeconfig"
	// DefaultSettleTimeout bounds each wait for the pods to settle.
	DefaultSettleTimeout = 3 * time.Minute
)

// Options configure a run. Errors about them name them by gpudra-sim up's
// flags, given here with each; DefaultOptions has the flags' defaults.
type Options struct {
	// Fleet is a built-in fleet's name or a fleet YAML file (--fleet).
	Fleet string
	// ChartValues is a values file for gpudra's Helm chart, as helm
	// install -f (--chart-values); empty: the chart's own.
	ChartValues string
	// Manifests is a directory or file of YAML manifests to apply
	// (--manifests); empty: the repository's examples/, looked for in the
	// working directory and its parent.
	Manifests string
	// Events is a YAML file of GPU health events to play after the apply
	// (--events).
	Events string
	// Report, if set, is where the JSON report is written (--report).
	Report string
	// KeepRunning keeps the cluster running after the report until ctx is
	// done, with a kubeconfig written to Kubeconfig (--keep-running,
	// --kubeconfig).
	KeepRunning bool
	Kubeconfig  string
	// SettleTimeout bounds each wait for the pods and workloads to settle
	// (--settle-timeout).
	SettleTimeout time.Duration
	// RealNodes is how many of the fleet's first nodes are real, where the
	// machine can run them (--real-nodes; cluster.RealNodes.FallBack).
	RealNodes int
	// FleetView, if set, is the address (host:port) the fleet view page of
	// the cluster is served on while it runs (--fleet-view).
	FleetView string
	// KubernetesVersion is the minor version the cluster behaves as
	// (--kubernetes-version; controlplane.Options.KubernetesVersion).
	// Empty: the build's.
	KubernetesVersion string
	// FeatureGates override feature gates at that version
	// (--feature-gates).
	FeatureGates map[string]bool
	// Stdout gets the table, the plugins' endpoints and, with
	// KeepRunning, how to reach the cluster. Nil: os.Stdout.
	Stdout io.Writer
	// Progress, if set, gets one line per step.
	Progress func(msg string)
	// AroundStop, if set, is called with the function that stops the
	// cluster, and must call it (gpudra-sim silences the API server's
	// etcd client, which complains about every request the stop cancels).
	AroundStop func(stop func())
}

// DefaultOptions returns the options of gpudra-sim up's flag defaults.
func DefaultOptions() Options {
	return Options{Fleet: DefaultFleet, Kubeconfig: DefaultKubeconfig, SettleTimeout: DefaultSettleTimeout}
}

// Result is what a run saw.
type Result struct {
	// Report is the cluster after the pods settled, with the objects the
	// API server refused.
	Report *cluster.Report
	// RealNodesDropped says why the cluster ran without the real nodes
	// Options.RealNodes asked for; empty when it ran with them.
	RealNodesDropped string
}

// runner is one run.
type runner struct {
	o      Options
	stdout io.Writer
}

func (r *runner) progress(format string, args ...any) {
	if r.o.Progress != nil {
		r.o.Progress(fmt.Sprintf(format, args...))
	}
}

// Run runs the cluster as the options say. It refuses options it cannot
// honour before it starts the cluster. An object the API server refused,
// pods that did not settle and a health event that could not be played
// fail the run after the report, which the Result then holds all the
// same; a cluster that does not start fails it with no Result.
func Run(ctx context.Context, o Options) (*Result, error) {
	r := &runner{o: o, stdout: o.Stdout}
	if r.stdout == nil {
		r.stdout = os.Stdout
	}
	if o.SettleTimeout <= 0 {
		return nil, fmt.Errorf("--settle-timeout %v: must be positive", o.SettleTimeout)
	}
	dir := o.Manifests
	if dir == "" {
		var err error
		if dir, err = findExamples(); err != nil {
			return nil, err
		}
	}
	objs, err := manifests.Load(dir)
	if err != nil {
		return nil, err
	}
	fleet, err := simfleet.Load(o.Fleet)
	if err != nil {
		return nil, fmt.Errorf("--fleet: %w", err)
	}
	switch {
	case o.RealNodes < 0:
		return nil, fmt.Errorf("--real-nodes %d: want 0 or more", o.RealNodes)
	case o.RealNodes > len(fleet.Nodes):
		return nil, fmt.Errorf("--real-nodes %d: fleet %s has %d nodes", o.RealNodes, o.Fleet, len(fleet.Nodes))
	}
	kubeVersion, err := controlplane.ParseKubernetesVersion(o.KubernetesVersion)
	if err != nil {
		return nil, fmt.Errorf("--kubernetes-version: %w", err)
	}
	if _, newest, err := controlplane.VersionRange(); err != nil {
		return nil, err
	} else if o.RealNodes > 0 && kubeVersion != newest {
		return nil, fmt.Errorf("--real-nodes %d with --kubernetes-version %s: a real node's kubelet is the build's, Kubernetes %s, and a kubelet newer than its API server is not a supported skew; run real nodes at %s", o.RealNodes, kubeVersion, newest, newest)
	}
	var events []cluster.ScheduledHealthEvent
	if o.Events != "" {
		if events, err = cluster.LoadHealthEvents(o.Events); err != nil {
			return nil, fmt.Errorf("--events: %w", err)
		}
		if err := cluster.CheckHealthEvents(events, fleet); err != nil {
			return nil, fmt.Errorf("--events: %w", err)
		}
	}
	values, err := readChartValues(o.ChartValues)
	if err != nil {
		return nil, err
	}
	var fleetView net.Listener
	if o.FleetView != "" {
		if fleetView, err = listenFleetView(o.FleetView); err != nil {
			return nil, err
		}
		defer fleetView.Close()
	}

	r.progress("starting the local cluster: fleet %s, %d nodes, Kubernetes %s", o.Fleet, len(fleet.Nodes), kubeVersion)
	start := time.Now()
	opts := cluster.Options{Fleet: fleet, ChartValues: values, Progress: o.Progress}
	opts.ControlPlane.KubernetesVersion = o.KubernetesVersion
	opts.ControlPlane.FeatureGates = o.FeatureGates
	if o.RealNodes > 0 {
		opts.RealNodes = &cluster.RealNodes{Count: o.RealNodes, FleetName: o.Fleet, FallBack: true}
	}
	c, err := cluster.Start(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("start the local cluster: %w", err)
	}
	res, err := r.run(ctx, c, start, objs, dir, events, fleetView)
	r.stop(ctx, c, &err)
	return res, err
}

// run applies the objects to the started cluster, plays the events, waits
// for the cluster to settle and reports.
func (r *runner) run(ctx context.Context, c *cluster.Cluster, start time.Time, objs []manifests.Object, dir string, events []cluster.ScheduledHealthEvent, fleetView net.Listener) (*Result, error) {
	o := r.o
	r.progress("cluster ready in %v", time.Since(start).Round(time.Millisecond))
	if fleetView != nil {
		// Stopped before the cluster, so that its watches do not outlive
		// the API server.
		fleetViewCtx, stopFleetView := context.WithCancel(ctx)
		defer stopFleetView()
		url, err := serveFleetView(fleetViewCtx, c, fleetView)
		if err != nil {
			return nil, err
		}
		r.progress("fleet view: %s", url)
	}

	probes, err := c.RealNodeProbes()
	if err != nil {
		return nil, err
	}
	objs = append(objs, probes...)
	r.progress("applying %d objects from %s", len(objs), dir)
	applied := time.Now()
	refused, err := c.Apply(ctx, objs)
	if err != nil {
		return nil, err
	}
	var eventErrs []error
	eventsDone := make(chan struct{})
	go func() {
		defer close(eventsDone)
		_ = c.RunHealthEvents(ctx, applied, events, func(e cluster.ScheduledHealthEvent, err error) {
			if err != nil {
				r.progress("health event: %v", err)
				eventErrs = append(eventErrs, err)
				return
			}
			r.progress("health event at +%v: %s on %s GPU %d (%s)", e.After, e.Event, e.Node, e.GPU, e.Source)
		})
	}()
	for _, ref := range refused {
		r.progress("refused: %s", ref)
	}
	// Pods: Running, Succeeded, or Pending with a reason; workloads: their
	// controllers made the pods they will make.
	r.progress("waiting for the pods and workloads to settle")
	settleErr := r.settle(ctx, c)
	if len(events) > 0 {
		// The report is of the cluster after the last event, settled
		// again (the plugin republishes taints within about a second;
		// settling waits 2 s of quiet).
		<-eventsDone
		r.progress("all %d health events applied; waiting for the cluster to settle again", len(events))
		settleErr = r.settle(ctx, c)
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	report, err := c.Report(ctx)
	if err != nil {
		return nil, err
	}
	report.Refused = append(report.Refused, refused...)
	res := &Result{Report: report, RealNodesDropped: c.RealNodesDropped()}
	if err := r.writeReport(report); err != nil {
		return res, err
	}
	// The report comes first: what was refused or did not settle is in
	// it, and the rest is worth seeing all the same.
	var errs []error
	if len(refused) > 0 {
		errs = append(errs, fmt.Errorf("%d of %d objects refused by the API server (listed under REFUSED)", len(refused), len(objs)))
	}
	if settleErr != nil {
		errs = append(errs, fmt.Errorf("not settled within %v (--settle-timeout): %w", o.SettleTimeout, settleErr))
	}
	errs = append(errs, eventErrs...)
	if o.KeepRunning {
		if err := r.keepRunning(ctx, c, report); err != nil {
			errs = append(errs, err)
		}
	}
	return res, errors.Join(errs...)
}

// settle waits for the cluster to settle, at most Options.SettleTimeout.
func (r *runner) settle(ctx context.Context, c *cluster.Cluster) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, r.o.SettleTimeout)
	defer cancel()
	err := c.WaitSettled(ctx, 2*time.Second)
	if err == nil {
		r.progress("settled in %v", time.Since(start).Round(time.Millisecond))
	}
	return err
}

// writeReport prints the table and the plugins' endpoints, and writes the
// JSON report where the options say.
func (r *runner) writeReport(report *cluster.Report) error {
	fmt.Fprintln(r.stdout)
	report.WriteTable(r.stdout)
	more := "--report FILE lists every node's (nodes[].httpEndpoint)"
	if r.o.Report != "" {
		more = "nodes[].httpEndpoint in " + r.o.Report
	}
	if lines := cluster.PluginEndpointLines(report.Nodes, 3, more); len(lines) > 0 {
		fmt.Fprintln(r.stdout)
		for _, l := range lines {
			fmt.Fprintln(r.stdout, l)
		}
	}
	if r.o.Report == "" {
		return nil
	}
	data, err := json.MarshalIndent(report, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(r.o.Report, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("--report: %w", err)
	}
	r.progress("report written to %s", r.o.Report)
	return nil
}

// stop stops the cluster, adding its error to *err, and says what to try
// next.
func (r *runner) stop(ctx context.Context, c *cluster.Cluster, err *error) {
	r.progress("stopping the local cluster")
	stopping := time.Now()
	var stopErr error
	stop := func() { stopErr = c.Stop() }
	if r.o.AroundStop != nil {
		r.o.AroundStop(stop)
	} else {
		stop()
	}
	if stopErr != nil && *err == nil {
		*err = fmt.Errorf("stop the local cluster: %w", stopErr)
	}
	r.progress("stopped in %v", time.Since(stopping).Round(time.Millisecond))
	if r.o.KeepRunning || ctx.Err() != nil {
		return
	}
	next := []string{"--keep-running keeps the cluster up for kubectl"}
	if r.o.Events == "" {
		next = append(next, "--events FILE injects GPU faults")
	}
	if r.o.Report == "" {
		next = append(next, "--report FILE writes the report as JSON")
	}
	r.progress("next: %s (gpudra-sim up -h)", strings.Join(next, "; "))
}

// keepRunning writes a kubeconfig and waits until ctx is done.
func (r *runner) keepRunning(ctx context.Context, c *cluster.Cluster, report *cluster.Report) error {
	path, err := filepath.Abs(r.o.Kubeconfig)
	if err != nil {
		return err
	}
	if err := c.ControlPlane().WriteKubeconfig(path); err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	fmt.Fprintf(r.stdout, `
The cluster keeps running until you press Ctrl-C. To use it:

  export KUBECONFIG=%s
  kubectl get nodes
  kubectl get resourceslices
  kubectl get pods,resourceclaims -A
  kubectl logs -n NAMESPACE POD [-c CONTAINER]

`, path)
	for _, l := range cluster.ContainerAccessLines(report.Nodes) {
		fmt.Fprintln(r.stdout, l)
	}
	fmt.Fprintln(r.stdout)
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
