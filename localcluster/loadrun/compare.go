package loadrun

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/google/pprof/profile"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/simnode"
)

// DefaultBaselineDriver is the driver name of the baseline driver every
// node of the load run runs beside gpudra (package baseline), with a
// DeviceClass of the same name (--baseline-driver).
const DefaultBaselineDriver = "baseline.gpudra.sim"

// DefaultRounds is how many rounds of each driver the load run makes
// (--rounds), alternating, so that a machine that gets busier or
// quieter during the run weighs on both alike.
const DefaultRounds = 2

// gpudraMIGClass is gpudra's DeviceClass of MIG devices (its chart's).
const gpudraMIGClass = "mig.nvidia.com"

// driverRun is one driver's side of the comparison.
type driverRun struct {
	name, driver string
	// gpuClass and migClass are the driver's DeviceClasses of whole GPUs
	// and of MIG devices.
	gpuClass, migClass string
	// templates are the claim templates of its pods, by kind.
	templates map[podKind]string
	rounds    []*Round
	// profile is the CPU profile of the last round, for --cpu-profile.
	profile []byte
}

// compareDrivers runs the baseline driver's and gpudra's rounds
// alternately on the same cluster, prints the comparison and returns each
// driver's rounds.
func (lr *runner) compareDrivers(ctx context.Context, c *cluster.Cluster, client kubernetes.Interface, stateDir string) (baseline, gpudra []*Round, err error) {
	o := lr.o
	runs := loadRuns(c.Options().DriverName, c.Options().Baseline)
	if err := createLoadClasses(ctx, client, runs); err != nil {
		return nil, nil, err
	}
	kinds := lr.mix.kinds(o.Pods)
	for i := range o.Rounds {
		for _, run := range runs {
			prefix := fmt.Sprintf("%s%d", run.name, i)
			r, prof, err := profiledRound(func() (*Round, error) {
				return lr.loadRound(ctx, c, client, prefix, kinds, run.templates, o.RoundTimeout)
			})
			if err != nil {
				return nil, nil, err
			}
			lr.progress("checking that every pod got its own device, prepared and resolved through CDI")
			if err := verifyLoad(ctx, c, client, prefix, o.Pods, run.driver); err != nil {
				return nil, nil, err
			}
			lr.progress("deleting the pods")
			if err := deleteAllPods(ctx, client, o.RoundTimeout); err != nil {
				return nil, nil, err
			}
			if r.ByDriver, err = cpuByDriver(prof); err != nil {
				return nil, nil, fmt.Errorf("attribute the CPU profile of round %s: %w", prefix, err)
			}
			run.rounds, run.profile = append(run.rounds, r), prof
		}
	}
	for _, w := range []struct {
		file string
		run  *driverRun
	}{{o.CPUProfile, runs[1]}, {o.CPUProfileBaseline, runs[0]}} {
		if w.file != "" {
			if err := os.WriteFile(w.file, w.run.profile, 0o644); err != nil {
				return nil, nil, err
			}
		}
	}
	lr.printComparison(stateDir, runs[0], runs[1])
	return runs[0].rounds, runs[1].rounds, nil
}

// loadRuns are the two sides of the comparison: the baseline driver's
// (driver name baseline) and gpudra's (driver name gpudra), with a claim
// template per pod kind.
func loadRuns(gpudra, baseline string) []*driverRun {
	runs := []*driverRun{
		{name: "baseline", driver: baseline, gpuClass: baseline, migClass: "mig." + baseline},
		{name: "gpudra", driver: gpudra, gpuClass: gpudra, migClass: gpudraMIGClass},
	}
	for _, run := range runs {
		run.templates = map[podKind]string{}
		for _, k := range []podKind{kindGPU, kindMIG, kindShare} {
			run.templates[k] = fmt.Sprintf("one-%s-%s", run.name, k)
		}
	}
	return runs
}

// createLoadClasses creates the baseline driver's DeviceClasses and a
// claim template per driver and pod kind, each asking for one device
// (loadRequest). The baseline's whole-GPU class selects what gpudra's
// gpu.nvidia.com selects, whole GPUs, and its MIG class what
// mig.nvidia.com selects, among the same devices (gpudra's attributes,
// which the baseline publishes in its own driver's domain): a class of
// every device would offer the MIG placements to whole-GPU claims too, a
// larger search for the scheduler.
func createLoadClasses(ctx context.Context, client kubernetes.Interface, runs []*driverRun) error {
	base := runs[0]
	for name, typ := range map[string]string{base.gpuClass: "gpu", base.migClass: "mig"} {
		class := &resourceapi.DeviceClass{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf("device.driver == '%[1]s' && device.attributes['%[1]s'].type == '%[2]s'", base.driver, typ),
			}}}},
		}
		if _, err := client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("DeviceClass %s: %w", name, err)
		}
	}
	for _, run := range runs {
		for kind, name := range run.templates {
			tmpl := &resourceapi.ResourceClaimTemplate{
				ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
				Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
					Requests: []resourceapi.DeviceRequest{loadRequest(kind, run.driver, run.gpuClass, run.migClass)},
				}}},
			}
			if _, err := client.ResourceV1().ResourceClaimTemplates("default").Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
				return fmt.Errorf("ResourceClaimTemplate %s: %w", name, err)
			}
		}
	}
	return nil
}

// profiledRound runs f under a CPU profile and returns the profile.
func profiledRound(f func() (*Round, error)) (*Round, []byte, error) {
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		return nil, nil, err
	}
	r, err := f()
	pprof.StopCPUProfile()
	return r, buf.Bytes(), err
}

// cpuByDriver sums a CPU profile's samples by the driver whose goroutines
// took them (simnode.DriverLabel).
func cpuByDriver(data []byte) (map[string]time.Duration, error) {
	p, err := profile.Parse(bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	idx := -1
	for i, st := range p.SampleType {
		if st.Type == "cpu" && st.Unit == "nanoseconds" {
			idx = i
		}
	}
	if idx < 0 {
		return nil, fmt.Errorf("no cpu/nanoseconds samples in the profile")
	}
	out := map[string]time.Duration{}
	for _, s := range p.Sample {
		if drivers := s.Label[simnode.DriverLabel]; len(drivers) == 1 {
			out[drivers[0]] += time.Duration(s.Value[idx])
		}
	}
	return out, nil
}

// profilePeriod is the CPU profile's sampling period (100 Hz): a driver's
// CPU from the profile is a count of these, so its error is about the
// square root of the count.
const profilePeriod = 10 * time.Millisecond

// totals sums a driver's rounds: makespan, process CPU and the CPU its
// own goroutines took (by profile label).
func (r *driverRun) totals() (makespan, cpu, own time.Duration) {
	for _, round := range r.rounds {
		makespan += round.Makespan
		cpu += round.CPU
		own += round.ByDriver[r.driver]
	}
	return makespan, cpu, own
}

// printComparison writes the rounds of both drivers and how they compare.
func (lr *runner) printComparison(stateDir string, base, gpudra *driverRun) {
	o, mix, w := lr.o, lr.mix, lr.out
	pods := float64(o.Pods * o.Rounds)
	bm, bc, bo := base.totals()
	gm, gc, gown := gpudra.totals()
	perPod := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / pods }
	fmt.Fprintf(w, "\nload run: %d pods on %d simulated nodes (8 H100 each), %s; %d rounds of each driver, alternating\n", o.Pods, o.Nodes, mix.describe(o.Pods), o.Rounds)
	for _, r := range []*driverRun{base, gpudra} {
		for i, round := range r.rounds {
			fmt.Fprintf(w, "  %-8s round %d: makespan %v (%.1f pods/s, CPU %.1f s = %.1f ms per pod, the driver's own %.2f ms per claim); create to bound p50 %v p99 %v; to Running p50 %v p99 %v\n",
				r.name, i+1, round.Makespan.Round(time.Millisecond), float64(o.Pods)/round.Makespan.Seconds(),
				round.CPU.Seconds(), float64(round.CPU.Microseconds())/1000/float64(o.Pods), float64(round.ByDriver[r.driver].Microseconds())/1000/float64(o.Pods),
				percentile(round.Bound, 50), percentile(round.Bound, 99), percentile(round.Running, 50), percentile(round.Running, 99))
		}
	}
	fmt.Fprintf(w, `  gpudra / baseline: makespan %.2fx, CPU per pod %.2fx (%.1f ms vs %.1f ms)
  each driver's plugin CPU per claim (pprof label %s): gpudra %.2f ms (%d samples), baseline %.2f ms (%d samples); gpudra's plugin %.1f%% of its rounds' CPU
  every pod Running %s
  peak RSS of this process: %s; GOMAXPROCS %d; state in %s
`, gm.Seconds()/bm.Seconds(), float64(gc)/float64(bc), perPod(gc), perPod(bc),
		simnode.DriverLabel, perPod(gown), gown/profilePeriod, perPod(bo), bo/profilePeriod, 100*gown.Seconds()/gc.Seconds(),
		verified(mix), peakRSS(), runtime.GOMAXPROCS(0), stateDir)
	g, b := gpudra.rounds[len(gpudra.rounds)-1], base.rounds[len(base.rounds)-1]
	printRequests(w, o.Pods, g.Requests, b.Requests)
}

// verified says what verifyLoad checked of every round's pods.
func verified(mix Mix) string {
	if mix != MixMixed {
		return "with its own device prepared on its node and resolved through CDI"
	}
	return "with its own device, or share of one, of its kind, prepared on its node and resolved through CDI; " +
		"gpudra's MIG devices created on their GPUs and its shares in its checkpoint. " +
		"The baseline serves the same claims from the same devices and counters, but creates no MIG device and " +
		"keeps no share: it writes an environment-only CDI spec for each"
}
