package preparebench

import (
	"context"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/draplugin"

	"github.com/gpudra/gpudra/localcluster/controlplane"
)

// BenchmarkStartToSlicesRealAPIServer: from draplugin.Start to the node's
// ResourceSlices being listed by the API server (ms-to-slices), and to
// Start returning (ms-to-start), for a node of eight H100s whose slices
// were deleted before each start, as on a new node. It also checks that
// the plugin's feature probe found nothing missing in this API server.
func BenchmarkStartToSlicesRealAPIServer(b *testing.B) {
	ctx, client, n := startBench(b)
	selector := metav1.ListOptions{FieldSelector: "spec.nodeName=" + node}
	var toSlices, toStart time.Duration
	i := 0
	for range b.N {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, selector)
		if err != nil {
			b.Fatal(err)
		}
		for _, s := range list.Items {
			if err := client.ResourceV1().ResourceSlices().Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		cfg := pluginConfig(b, client, n)
		for _, d := range []string{cfg.PluginDataDir, cfg.RegistrarDir, cfg.CDIDir} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		start := time.Now()
		started := make(chan *draplugin.Driver, 1)
		go func() {
			d, err := draplugin.Start(klog.NewContext(ctx, klog.NewKlogr().V(10)), cfg)
			if err != nil {
				b.Error(err)
			}
			started <- d
		}()
		for {
			list, err := client.ResourceV1().ResourceSlices().List(ctx, selector)
			if err != nil {
				b.Fatal(err)
			}
			if len(list.Items) > 0 && int64(len(list.Items)) == list.Items[0].Spec.Pool.ResourceSliceCount {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
		toSlices += time.Since(start)
		d := <-started
		toStart += time.Since(start)
		d.Stop()
		i++
	}
	b.ReportMetric(float64(toSlices.Milliseconds())/float64(i), "ms-to-slices")
	b.ReportMetric(float64(toStart.Milliseconds())/float64(i), "ms-to-start")
	events, err := client.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range events.Items {
		if e.Type == corev1.EventTypeWarning && e.InvolvedObject.Kind == "Node" && e.InvolvedObject.Name == node {
			b.Errorf("Node event %s: %s", e.Reason, e.Message)
		}
	}
}

// TestFeatureProbeRealAPIServer: the API server validates the plugin's
// feature probe and, with every DRA feature on, keeps all its fields; as
// a dry run it stores nothing.
func TestFeatureProbeRealAPIServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cp.Stop() }()
	client, err := kubernetes.NewForConfig(cp.RESTConfig("test", 100, 200))
	if err != nil {
		t.Fatal(err)
	}
	probe := devicemodel.FeatureProbe(driver, node)
	got, err := client.ResourceV1().ResourceSlices().Create(ctx, probe.DeepCopy(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatalf("dry-run create of the probe: %v", err)
	}
	dropped := &resourceslice.DroppedFieldsError{DesiredSlice: probe, ActualSlice: got}
	if disabled := dropped.DisabledFeatures(); len(disabled) > 0 {
		t.Errorf("the probe found %v disabled in an API server with every DRA feature on", disabled)
	}
	if _, err := client.ResourceV1().ResourceSlices().Get(ctx, probe.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after a dry run, get of the probe: %v, want not found", err)
	}
}
