package simnode

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime/pprof"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gpudra/gpudra/localcluster/baseline"
)

// DriverLabel is the pprof label that names the DRA driver whose goroutines
// did the work: every goroutine a node's plugin (gpudra's, or the baseline
// driver) starts carries it, so that a CPU profile of the whole process
// tells each driver's CPU apart.
const DriverLabel = "dra-driver"

// labeled runs start with the node's goroutine labeled as the driver's:
// the goroutines it starts (gRPC server, ResourceSlice controller,
// checkpoint committer, ...) inherit the label.
func labeled(ctx context.Context, driverName string, start func(context.Context)) {
	pprof.Do(ctx, pprof.Labels(DriverLabel, driverName), start)
}

// startBaseline starts the baseline driver (Config.Baseline) beside
// gpudra's plugin, publishing what gpudra published for the node (its
// devices and counter sets, read back from the API server), and waits
// until the DRA manager has it registered and its slices are published.
func (n *Node) startBaseline(ctx context.Context) error {
	list, err := n.cfg.KubeletClient.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.cfg.Name})
	if err != nil {
		return fmt.Errorf("node %s: baseline driver: read gpudra's ResourceSlices: %w", n.cfg.Name, err)
	}
	var pool resourceslice.Pool
	want := 0
	for _, s := range list.Items {
		if s.Spec.Driver != n.cfg.DriverName {
			continue
		}
		pool.Slices = append(pool.Slices, resourceslice.Slice{Devices: s.Spec.Devices, SharedCounters: s.Spec.SharedCounters})
		want += len(s.Spec.Devices)
	}
	cfg := baseline.Config{
		DriverName:    n.cfg.Baseline,
		NodeName:      n.cfg.Name,
		KubeClient:    n.cfg.KubeletClient,
		PluginDataDir: filepath.Join(n.cfg.Dir, "plugins", n.cfg.Baseline),
		RegistrarDir:  n.cfg.registryDir(),
		CDIDir:        n.cfg.CDIDir(),
		Resources:     resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{n.cfg.Name: pool}},
	}
	var d *baseline.Driver
	labeled(n.ctx, cfg.DriverName, func(ctx context.Context) { d, err = baseline.Start(ctx, cfg) })
	if err != nil {
		return fmt.Errorf("node %s: %w", n.cfg.Name, err)
	}
	n.baseline = d
	return n.waitForDriver(ctx, cfg.DriverName, func() int { return want })
}
