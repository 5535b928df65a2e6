package loadrun

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

// FleetCost is what an idle started cluster costs, in all and per node:
// the figures that decide how many simulated nodes one process holds, and
// which of them are the drivers'.
type FleetCost struct {
	Nodes int
	// Started is from the start of the control plane until every node's
	// plugins were registered and their ResourceSlices published.
	Started time.Duration
	// RSS is the process's resident memory after a GC, Heap the Go heap
	// in use then, in bytes.
	RSS, Heap uint64
	// Goroutines in all, and by DRA driver (pprof label
	// simnode.DriverLabel; "" for the rest: kubelets, control plane).
	Goroutines         int
	GoroutinesByDriver map[string]int
	// Watches are the watches the API server serves, by component.
	Watches map[string]int
	// Slices are the ResourceSlices by driver.
	Slices map[string]SliceCost
	// Idle is how long the idle fleet was profiled; IdleCPU the process's
	// CPU then, IdleByDriver the part each driver's goroutines took:
	// what the drivers' periodic work (health, discovery, sweep) costs.
	Idle, IdleCPU time.Duration
	IdleByDriver  map[string]time.Duration
	// IdleProfile is that CPU profile (Options.CPUProfileIdle).
	IdleProfile []byte
}

// idleProfile is how long the load run profiles the idle fleet.
const idleProfile = 15 * time.Second

// SliceCost counts one driver's ResourceSlices.
type SliceCost struct {
	Count, Devices int
	// Bytes is the slices' protobuf size, what etcd stores and watches
	// carry.
	Bytes int
}

// measureFleet measures the started cluster's cost.
func measureFleet(ctx context.Context, cp *controlplane.ControlPlane, client kubernetes.Interface, nodes int, started time.Duration) (*FleetCost, error) {
	fc := &FleetCost{Nodes: nodes, Started: started, Watches: map[string]int{}, Slices: map[string]SliceCost{}}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	fc.Heap = ms.HeapInuse
	rss, err := procStatusKB("VmRSS:")
	if err != nil {
		return nil, err
	}
	fc.RSS = rss * 1024
	fc.Goroutines = runtime.NumGoroutine()
	if fc.GoroutinesByDriver, err = goroutinesByDriver(); err != nil {
		return nil, fmt.Errorf("goroutine profile: %w", err)
	}
	for k, v := range cp.OpenWatches() {
		fc.Watches[k.Component] += v
	}
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	for i := range list.Items {
		s := &list.Items[i]
		c := fc.Slices[s.Spec.Driver]
		c.Count++
		c.Devices += len(s.Spec.Devices)
		c.Bytes += s.Size()
		fc.Slices[s.Spec.Driver] = c
	}
	var prof []byte
	cpuBefore := processCPU()
	if _, prof, err = profiledRound(func() (*Round, error) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(idleProfile):
			return nil, nil
		}
	}); err != nil {
		return nil, err
	}
	fc.Idle, fc.IdleCPU, fc.IdleProfile = idleProfile, processCPU()-cpuBefore, prof
	if fc.IdleByDriver, err = cpuByDriver(prof); err != nil {
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
func (fc *FleetCost) print(w io.Writer) {
	n := float64(fc.Nodes)
	mib := func(b uint64) float64 { return float64(b) / (1 << 20) }
	fmt.Fprintf(w, "\nidle fleet of %d nodes: all slices published %v after the start (%.1f nodes/s)\n", fc.Nodes, fc.Started.Round(time.Millisecond), n/fc.Started.Seconds())
	fmt.Fprintf(w, "  RSS %.0f MiB (%.2f MiB per node), Go heap in use %.0f MiB (%.2f MiB per node), control plane included\n", mib(fc.RSS), mib(fc.RSS)/n, mib(fc.Heap), mib(fc.Heap)/n)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "    goroutines of\tall\tper node\t")
	for _, d := range slices.Sorted(maps.Keys(fc.GoroutinesByDriver)) {
		fmt.Fprintf(tw, "    %s\t%d\t%.1f\t\n", cmp.Or(d, "the rest (kubelets, control plane)"), fc.GoroutinesByDriver[d], float64(fc.GoroutinesByDriver[d])/n)
	}
	fmt.Fprintf(tw, "    all\t%d\t%.1f\t\n", fc.Goroutines, float64(fc.Goroutines)/n)
	_ = tw.Flush()
	perNodeMS := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / n / fc.Idle.Seconds() }
	fmt.Fprintf(w, "  idle CPU over %v: the process %.1f%% of a core (%.2f ms per node per second)", fc.Idle, 100*fc.IdleCPU.Seconds()/fc.Idle.Seconds(), perNodeMS(fc.IdleCPU))
	for _, d := range slices.Sorted(maps.Keys(fc.IdleByDriver)) {
		fmt.Fprintf(w, "; %s %.3f ms per node per second (%d samples)", d, perNodeMS(fc.IdleByDriver[d]), fc.IdleByDriver[d]/profilePeriod)
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "    open API watches of\tall\tper node\t")
	for _, c := range slices.Sorted(maps.Keys(fc.Watches)) {
		fmt.Fprintf(tw, "    %s\t%d\t%.2f\t\n", c, fc.Watches[c], float64(fc.Watches[c])/n)
	}
	_ = tw.Flush()
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "    ResourceSlices of\tslices\tdevices\tKiB (protobuf)\tslices per node\tKiB per node\t")
	for _, d := range slices.Sorted(maps.Keys(fc.Slices)) {
		s := fc.Slices[d]
		fmt.Fprintf(tw, "    %s\t%d\t%d\t%.0f\t%.2f\t%.1f\t\n", d, s.Count, s.Devices, float64(s.Bytes)/1024, float64(s.Count)/n, float64(s.Bytes)/1024/n)
	}
	_ = tw.Flush()
}
