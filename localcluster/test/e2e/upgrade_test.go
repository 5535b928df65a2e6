package e2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/simfleet"

	"github.com/gpudra/gpudra/localcluster/cluster"
)

// TestUpgradeUnderLoad: while pods with claims are created and deleted
// continuously, every node's plugin is rolled to a new pod as the chart's
// DaemonSet rolls (maxSurge 1: the new plugin, with a new --pod-uid,
// registers beside the old one, which then stops). No Prepare or
// Unprepare call of the kubelet fails, and every pod starts.
func TestUpgradeUnderLoad(t *testing.T) {
	ctx := testContext(t, 4*time.Minute)
	fleet, err := simfleet.Load("demo")
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.Start(ctx, cluster.Options{Fleet: fleet})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop: %v", err)
		}
	}()
	client := c.Client()
	const ns = metav1.NamespaceDefault
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "one-gpu"}}
	tmpl.Spec.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}}}
	if _, err := client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	var created, started atomic.Int64
	loadCtx, stopLoad := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; loadCtx.Err() == nil; i++ {
				if err := podRoundTrip(loadCtx, c, fmt.Sprintf("load-%d-%d", w, i), &created, &started); err != nil && loadCtx.Err() == nil {
					errs <- err
					return
				}
			}
		})
	}

	time.Sleep(time.Second)
	start := time.Now()
	upgraded := 0
	for _, n := range c.SimNodes() {
		if fn, err := fleet.Node(n.Name()); err != nil || fn.Mode == simfleet.ModeDevicePlugin {
			continue // the DaemonSet's plugin does not run on a device-plugin node
		}
		upgraded++
		overlap, err := n.UpgradePlugin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("node %s: new plugin registered beside the old one after %v", n.Name(), overlap.Round(time.Millisecond))
	}
	upgrade := time.Since(start)
	time.Sleep(2 * time.Second)
	stopLoad()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	var prepareFailed, unprepareFailed int64
	for _, n := range c.SimNodes() {
		p, u := n.DRACallFailures()
		prepareFailed += p
		unprepareFailed += u
	}
	t.Logf("upgrade of %d nodes took %v; %d pods created, %d started (the others were starting when the load stopped); failed (and retried) calls: %d Prepare, %d Unprepare",
		upgraded, upgrade.Round(time.Millisecond), created.Load(), started.Load(), prepareFailed, unprepareFailed)
	if prepareFailed+unprepareFailed != 0 {
		t.Errorf("%d Prepare and %d Unprepare calls failed during the upgrade", prepareFailed, unprepareFailed)
	}
	if upgraded == 0 {
		t.Error("no node was upgraded")
	}
	if started.Load() == 0 {
		t.Error("no pod started during the upgrade")
	}
}

// podRoundTrip creates a pod with a claim from the template one-gpu,
// waits until it runs, deletes it and waits until it is gone (its claim
// unprepared).
func podRoundTrip(ctx context.Context, c *cluster.Cluster, name string, created, started *atomic.Int64) error {
	client := c.Client()
	pods := client.CoreV1().Pods(metav1.NamespaceDefault)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			Containers:     []corev1.Container{{Name: "ctr", Image: "cuda", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("one-gpu")}},
		},
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return err
	}
	created.Add(1)
	var reason string
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		reason = cluster.PodReason(p)
		return p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		return fmt.Errorf("pod %s did not start (%s): %w", name, reason, err)
	}
	started.Add(1)
	// Deleted even when the load stops meanwhile.
	delCtx := context.WithoutCancel(ctx)
	if err := pods.Delete(delCtx, name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(delCtx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := pods.Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}
