package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/pprof/profile"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpudra/gpudra/localcluster/controlplane"
	"github.com/gpudra/gpudra/localcluster/simnode"
)

// fleetCost is what an idle started cluster costs, in all and per node:
// the figures that decide how many simulated nodes one process holds, and
// which of them are the drivers'.
type fleetCost struct {
	nodes int
	// started is from the start of the control plane until every node's
	// plugins were registered and their ResourceSlices published.
	started time.Duration
	// rss is the process's resident memory after a GC; heap the Go
	// heap in use then.
	rss, heap uint64
	// goroutines in all, and by DRA driver (pprof label
	// simnode.DriverLabel; "" for the rest: kubelets, control plane).
	goroutines         int
	goroutinesByDriver map[string]int
	// watches are the watches the API server serves, by component.
	watches map[string]int
	// slices are the ResourceSlices by driver.
	slices map[string]sliceCost
	// idle is how long the idle fleet was profiled; idleCPU the process's
	// CPU then, idleByDriver the part each driver's goroutines took:
	// what the drivers' periodic work (health, discovery, sweep) costs.
	idle, idleCPU time.Duration
	idleByDriver  map[string]time.Duration
	// idleProfile is that CPU profile, for --cpu-profile-idle.
	idleProfile []byte
}

// idleProfile is how long the load run profiles the idle fleet.
const idleProfile = 15 * time.Second

// sliceCost counts one driver's ResourceSlices.
type sliceCost struct {
	count, devices int
	// bytes is the slices' protobuf size, what etcd stores and watches
	// carry.
	bytes int
}

// measureFleet measures the started cluster's cost.
func measureFleet(ctx context.Context, cp *controlplane.ControlPlane, client kubernetes.Interface, nodes int, started time.Duration) (*fleetCost, error) {
	fc := &fleetCost{nodes: nodes, started: started, watches: map[string]int{}, slices: map[string]sliceCost{}}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fc.heap = ms.HeapInuse
	rss, err := procStatusKB("VmRSS:")
	if err != nil {
		return nil, err
	}
	fc.rss = rss * 1024
	fc.goroutines = runtime.NumGoroutine()
	if fc.goroutinesByDriver, err = goroutinesByDriver(); err != nil {
		return nil, fmt.Errorf("goroutine profile: %w", err)
	}
	for k, v := range cp.OpenWatches() {
		fc.watches[k.Component] += v
	}
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	for i := range list.Items {
		s := &list.Items[i]
		c := fc.slices[s.Spec.Driver]
		c.count++
		c.devices += len(s.Spec.Devices)
		c.bytes += s.Size()
		fc.slices[s.Spec.Driver] = c
	}
	var prof []byte
	cpuBefore := processCPU()
	if _, prof, err = profiledRound(func() (*roundResult, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(idleProfile):
			return nil, nil
		}
	}); err != nil {
		return nil, err
	}
	fc.idle, fc.idleCPU, fc.idleProfile = idleProfile, processCPU()-cpuBefore, prof
	if fc.idleByDriver, err = cpuByDriver(prof); err != nil {
		return nil, fmt.Errorf("attribute the idle fleet's CPU profile: %w", err)
	}
	return fc, nil
}

// goroutinesByDriver counts the process's goroutines by the DRA driver
// label they carry.
func goroutinesByDriver() (map[string]int, error) {
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 0); err != nil {
		return nil, err
	}
	p, err := profile.Parse(&buf)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, s := range p.Sample {
		driver := ""
		if d := s.Label[simnode.DriverLabel]; len(d) == 1 {
			driver = d[0]
		}
		out[driver] += int(s.Value[0])
	}
	return out, nil
}

// procStatusKB reads a kB field of /proc/self/status.
func procStatusKB(field string) (uint64, error) {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			return strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/self/status has no %s", field)
}

// print writes the cost, in all and per node.
func (fc *fleetCost) print(w io.Writer) {
	n := float64(fc.nodes)
	mib := func(b uint64) float64 { return float64(b) / (1 << 20) }
	fmt.Fprintf(w, "\nidle fleet of %d nodes: all slices published %v after the start (%.1f nodes/s)\n", fc.nodes, fc.started.Round(time.Millisecond), n/fc.started.Seconds())
	fmt.Fprintf(w, "  RSS %.0f MiB (%.2f MiB per node), Go heap in use %.0f MiB (%.2f MiB per node), control plane included\n", mib(fc.rss), mib(fc.rss)/n, mib(fc.heap), mib(fc.heap)/n)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "    goroutines of\tall\tper node\t")
	for _, d := range slices.Sorted(maps.Keys(fc.goroutinesByDriver)) {
		fmt.Fprintf(tw, "    %s\t%d\t%.1f\t\n", cmp.Or(d, "the rest (kubelets, control plane)"), fc.goroutinesByDriver[d], float64(fc.goroutinesByDriver[d])/n)
	}
	fmt.Fprintf(tw, "    all\t%d\t%.1f\t\n", fc.goroutines, float64(fc.goroutines)/n)
	_ = tw.Flush()
	perNodeMS := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / n / fc.idle.Seconds() }
	fmt.Fprintf(w, "  idle CPU over %v: the process %.1f%% of a core (%.2f ms per node per second)", fc.idle, 100*fc.idleCPU.Seconds()/fc.idle.Seconds(), perNodeMS(fc.idleCPU))
	for _, d := range slices.Sorted(maps.Keys(fc.idleByDriver)) {
		fmt.Fprintf(w, "; %s %.3f ms per node per second (%d samples)", d, perNodeMS(fc.idleByDriver[d]), fc.idleByDriver[d]/profilePeriod)
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "    open API watches of\tall\tper node\t")
	for _, c := range slices.Sorted(maps.Keys(fc.watches)) {
		fmt.Fprintf(tw, "    %s\t%d\t%.2f\t\n", c, fc.watches[c], float64(fc.watches[c])/n)
	}
	_ = tw.Flush()
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "    ResourceSlices of\tslices\tdevices\tKiB (protobuf)\tslices per node\tKiB per node\t")
	for _, d := range slices.Sorted(maps.Keys(fc.slices)) {
		s := fc.slices[d]
		fmt.Fprintf(tw, "    %s\t%d\t%d\t%.0f\t%.2f\t%.1f\t\n", d, s.count, s.devices, float64(s.bytes)/1024, float64(s.count)/n, float64(s.bytes)/1024/n)
	}
	_ = tw.Flush()
}
