// Package versionskew runs the repository's examples on the local cluster
// at the Kubernetes versions the build emulates (1.34 to 1.37 for a v1.37
// build), and checks at each what docs/guides/install.md promises: every
// example runs where the DRA features it needs are on; where one is off,
// its pods run on gpudra's fallback or stay Pending with the scheduler's
// reason; nothing was ever published in a form the API server dropped
// fields of; and no GPU is prepared for two claims.
//
// By default it runs the oldest and the newest version (CI's short form);
// -versions=all, or a list like -versions=1.35,1.36, runs others.
package versionskew

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/simfleet"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/controlplane"
	"github.com/gpudra/gpudra/localcluster/manifests"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

var versionsFlag = flag.String("versions", "", `Kubernetes minor versions to run, comma-separated, or "all"; default the oldest and the newest the build emulates`)

func TestMain(m *testing.M) {
	// Started as nvidia-cuda-mps-control or nvidia-imex: the nodes'
	// simulated daemons (cluster.Start installs them).
	if code, ok := cluster.Main(); ok {
		os.Exit(code)
	}
	clustertest.ParseFlags("ERROR")
	os.Exit(m.Run())
}

// needs are the examples that need a DRA feature beyond 1.34's defaults,
// by namespace, with the feature gates they need: where one is off, the
// example's pods may stay Pending (with a reason) or run on the fallback.
// Every other example must run at every version.
var needs = map[string][]string{
	// nvidia.com/gpu in a pod's resources becomes a claim only with
	// DeviceClass extendedResourceName.
	"extended-resources": {"DRAExtendedResource"},
	// Dynamic MIG devices share their GPU's counters; without them gpudra
	// publishes static MIG (the MIG devices that exist).
	"mig-dynamic": {"DRAPartitionableDevices"},
	// VFIO devices are kept apart from CUDA ones by shared counters.
	"vfio-passthrough": {"DRAPartitionableDevices"},
	// MPS shares are consumable capacity; without it, whole GPUs.
	"mps-sharing": {"DRAConsumableCapacity"},
	// Channel 0 serves many claims only with allowMultipleAllocations.
	"compute-domain": {"DRAConsumableCapacity"},
}

func versions(t *testing.T) []string {
	oldest, newest, err := controlplane.VersionRange()
	if err != nil {
		t.Fatal(err)
	}
	switch *versionsFlag {
	case "":
		return []string{oldest, newest}
	case "all":
		var out []string
		lo, _ := strconv.Atoi(strings.TrimPrefix(oldest, "1."))
		hi, _ := strconv.Atoi(strings.TrimPrefix(newest, "1."))
		for m := lo; m <= hi; m++ {
			out = append(out, fmt.Sprintf("1.%d", m))
		}
		return out
	}
	return strings.Split(*versionsFlag, ",")
}

func examplesDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "..", "examples")
}

// TestExamplesAtEachVersion starts the demo fleet at each version, one
// after the other in this process (the emulated version is process-wide),
// applies every example and checks the outcome.
func TestExamplesAtEachVersion(t *testing.T) {
	objs, err := manifests.Load(examplesDir())
	if err != nil {
		t.Fatal(err)
	}
	fleet, err := simfleet.Load("demo")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range versions(t) {
		t.Run(v, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			opts := cluster.Options{Fleet: fleet}
			opts.ControlPlane.KubernetesVersion = v
			c, err := cluster.Start(ctx, opts)
			if err != nil {
				t.Fatalf("start the local cluster at %s: %v", v, err)
			}
			defer func() {
				if err := c.Stop(); err != nil {
					t.Errorf("stop: %v", err)
				}
			}()
			if refused, err := c.Apply(ctx, objs); err != nil || len(refused) != 0 {
				t.Fatalf("apply the examples: refused %v, error %v", refused, err)
			}
			if err := c.WaitSettled(ctx, 3*time.Second); err != nil {
				t.Fatalf("pods did not settle: %v", err)
			}
			checkPods(t, ctx, c, v)
			checkNothingDropped(t, c)
			checkFallbackEvents(t, ctx, c, v)
			checkNoGPUTwice(t, c)
		})
	}
}

// checkPods: a pod of an example whose features are all on runs; one of
// an example that needs a feature off here runs or waits with a reason.
func checkPods(t *testing.T, ctx context.Context, c *cluster.Cluster, v string) {
	t.Helper()
	report, err := c.Report(ctx)
	if err != nil {
		t.Fatal(err)
	}
	examples := map[string]bool{}
	for _, p := range report.Pods {
		examples[p.Namespace] = true
		ok := p.Phase == string(corev1.PodRunning) || p.Phase == string(corev1.PodSucceeded)
		var off []string
		for _, g := range needs[p.Namespace] {
			if !controlplane.FeatureEnabled(g) {
				off = append(off, g)
			}
		}
		switch {
		case ok:
		case len(off) == 0:
			t.Errorf("pod %s/%s is %s at %s, where every feature it needs is on: %s", p.Namespace, p.Name, p.Phase, v, p.Reason)
		case p.Phase != string(corev1.PodPending) || p.Reason == "":
			t.Errorf("pod %s/%s is %s at %s (%v off) with reason %q; want Running, or Pending with the scheduler's reason", p.Namespace, p.Name, p.Phase, v, off, p.Reason)
		default:
			t.Logf("%s: pod %s/%s Pending (%v off): %s", v, p.Namespace, p.Name, off, p.Reason)
		}
	}
	for ns := range needs {
		if !examples[ns] {
			t.Errorf("no pod of example %s: the examples changed; update needs", ns)
		}
	}
}

// checkNothingDropped: no node's plugin saw the API server drop fields of
// a ResourceSlice it wrote. Where a feature is off, the plugin must have
// found out before its first publication: a slice stored without its
// shared counters could give a GPU and a MIG device of it to two claims
// until the plugin noticed.
func checkNothingDropped(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	for _, n := range c.SimNodes() {
		if n.MetricsURL() == "" {
			continue
		}
		got, err := counter(n.MetricsURL(), "gpudra_resourceslice_publish_errors_total")
		if err != nil {
			t.Errorf("node %s: %v", n.Name(), err)
			continue
		}
		if got != 0 {
			t.Errorf("node %s: %v ResourceSlice publication errors; the plugin published a form the API server did not keep", n.Name(), got)
		}
	}
}

// counter reads one unlabelled counter from a metrics endpoint.
func counter(url, name string) (float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(body)) {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(rest), 64)
		}
	}
	return 0, fmt.Errorf("%s serves no %s", url, name)
}

// fallbackReasons are the Node events of the fallbacks, by the gate whose
// absence causes them, on the nodes where the feature is in use.
var fallbackReasons = map[string]string{
	"DRAPartitionableDevices": "DynamicMIGUnavailable",
	"DRADeviceTaints":         "DeviceTaintsUnavailable",
}

// checkFallbackEvents: where a feature is off, the nodes that use it say
// so; where it is on, none does.
func checkFallbackEvents(t *testing.T, ctx context.Context, c *cluster.Cluster, v string) {
	t.Helper()
	events, err := c.Client().CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]map[string]bool{}
	for _, e := range events.Items {
		if e.InvolvedObject.Kind != "Node" {
			continue
		}
		if seen[e.Reason] == nil {
			seen[e.Reason] = map[string]bool{}
		}
		seen[e.Reason][e.InvolvedObject.Name] = true
	}
	for _, gate := range slices.Sorted(maps.Keys(fallbackReasons)) {
		reason := fallbackReasons[gate]
		nodes := slices.Sorted(maps.Keys(seen[reason]))
		if on := controlplane.FeatureEnabled(gate); on && len(nodes) > 0 {
			t.Errorf("%s is on at %s, yet nodes %v report %s", gate, v, nodes, reason)
		} else if !on && len(nodes) == 0 {
			t.Errorf("%s is off at %s, and no node reports %s", gate, v, reason)
		}
	}
	// The dynamic-MIG node falls back to static MIG at versions without
	// partitionable devices.
	if !controlplane.FeatureEnabled("DRAPartitionableDevices") && !seen["DynamicMIGUnavailable"]["dgx-h100-1"] {
		t.Errorf("at %s the dynamic-MIG node dgx-h100-1 did not report DynamicMIGUnavailable", v)
	}
}

// checkNoGPUTwice reads every node's checkpoint: no GPU, and no MIG device,
// is prepared for two claims, except as shares of it or with admin
// access, and no GPU is prepared whole for one claim while a MIG device
// of it is prepared for another.
func checkNoGPUTwice(t *testing.T, c *cluster.Cluster) {
	t.Helper()
	for _, n := range c.Nodes() {
		st, err := n.Checkpoint()
		if err != nil {
			t.Errorf("node %s: checkpoint: %v", n.Name(), err)
			continue
		}
		if err := heldTwice(st); err != nil {
			t.Errorf("node %s: %v", n.Name(), err)
		}
	}
}

func heldTwice(st *claimstate.State) error {
	whole := map[string]string{}   // GPU or MIG UUID -> claim holding it exclusively
	parts := map[string][]string{} // GPU UUID -> claims holding a MIG device or a share of it
	for _, uid := range slices.Sorted(maps.Keys(st.Claims)) {
		cl := st.Claims[uid]
		name := cl.Namespace + "/" + cl.Name
		for _, d := range cl.Devices {
			if d.AdminAccess || d.UUID == "" {
				continue
			}
			parent := d.ParentUUID
			if d.ShareID != "" {
				parent = d.UUID
			}
			if d.ShareID == "" {
				if other, ok := whole[d.UUID]; ok && other != name {
					return fmt.Errorf("device %s (%s) is prepared for claims %s and %s", d.Name, d.UUID, other, name)
				}
				whole[d.UUID] = name
			}
			if parent != "" {
				parts[parent] = append(parts[parent], name)
			}
		}
	}
	for _, gpu := range slices.Sorted(maps.Keys(parts)) {
		holder, ok := whole[gpu]
		if !ok {
			continue
		}
		for _, part := range parts[gpu] {
			if part != holder {
				return fmt.Errorf("GPU %s is prepared whole for claim %s while claim %s holds a part of it", gpu, holder, part)
			}
		}
	}
	return nil
}
