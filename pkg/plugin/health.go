package plugin

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/health"
)

// Node event reasons of GPU health.
const (
	ReasonGPUUnhealthy = "GPUUnhealthy"
	ReasonGPURecovered = "GPURecovered"
)

// healthLoop applies the hardware's health events to the published
// devices (package devicehealth) until ctx ends. A change of some GPU's
// taints asks the discovery loop to rebuild and republish, debounced (see
// health.Debouncer): a flapping GPU causes at most one republication per
// HealthInterval. When the watcher cannot run (NVML missing), it is
// started again with the discovery loop's backoff.
func (d *Driver) healthLoop(ctx context.Context, w hardware.HealthWatcher) {
	logger := klog.FromContext(ctx)
	deb := d.healthDebouncer
	defer deb.Stop()
	events := make(chan hardware.HealthEvent, 64)
	delay := minRetryDelay
	for {
		done := make(chan error, 1)
		if !d.healthWatching.Swap(true) {
			d.healthSignal.notify()
		}
		go func() { done <- w.WatchHealth(ctx, events) }()
		var err error
	watch:
		for {
			select {
			case e := <-events:
				d.onHealthEvent(ctx, e, deb)
			case err = <-done:
				break watch
			}
		}
		if ctx.Err() != nil {
			return
		}
		d.healthWatching.Store(false)
		d.healthSignal.notify()
		if err == nil {
			delay = minRetryDelay
		}
		logger.Error(err, "Watching GPU health stopped; starting again", "retryIn", delay)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, maxRetryDelay)
	}
}

// onHealthEvent applies one health event, logs it, and records a Node
// event when a GPU's taints change.
func (d *Driver) onHealthEvent(ctx context.Context, e hardware.HealthEvent, deb *health.Debouncer) {
	logger := klog.FromContext(ctx).WithValues("gpu", e.GPUUUID, "device", d.gpuDeviceName(e.GPUUUID), "event", e.String())
	policy := d.features.Health.Policy()
	next, t := d.features.Health.State().Apply(policy, e)
	d.features.Health.SetState(next)
	d.metrics.HealthEvent(string(e.Kind), t.Ignored)
	switch {
	case t.Ignored:
		logger.Info("Application XID: the GPU stays healthy", "ignoredXIDs", health.FormatXIDs(policy.IgnoreXIDs))
		return
	case !t.Changed():
		logger.V(2).Info("GPU health event changes no taint", "condition", t.After.String())
		return
	}
	deb.Changed()
	// The kubelet learns at once; the slices follow, debounced.
	d.healthSignal.notify()
	how := "withdrawn from the ResourceSlices (the API server lacks device taints)"
	if d.features.Health.Tainting() {
		how = "tainted " + describeTaints(t.After, d.cfg.DriverName, policy)
	}
	if t.After.Healthy() {
		logger.Info("GPU recovered; its devices are published untainted again", "was", t.Before.String())
		d.Event(corev1.EventTypeNormal, ReasonGPURecovered,
			fmt.Sprintf("GPU %s (%s) recovered (%s); it was %s; its devices are offered again", e.GPUUUID, d.gpuDeviceName(e.GPUUUID), e.Detail, t.Before))
		return
	}
	logger.Error(nil, "GPU unhealthy; its devices are "+how, "condition", t.After.String())
	d.Event(corev1.EventTypeWarning, ReasonGPUUnhealthy,
		fmt.Sprintf("GPU %s (%s) is unhealthy: %s; its devices are %s", e.GPUUUID, d.gpuDeviceName(e.GPUUUID), t.After, how))
}

// describeTaints renders a condition's taints: "gpu.nvidia.com/xid=79:NoSchedule".
func describeTaints(c health.Condition, driverName string, p health.Policy) string {
	var parts []string
	for _, t := range c.Taints(driverName, p) {
		parts = append(parts, fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect))
	}
	return strings.Join(parts, ", ")
}

// gpuDeviceName names a GPU as its full-GPU device ("gpu-3"), or "unknown
// GPU" when the last publication did not have it.
func (d *Driver) gpuDeviceName(uuid string) string {
	for _, g := range d.current().Inventory.GPUs {
		if g.UUID == uuid {
			return devicemodel.GPUName(g.Minor)
		}
	}
	return "unknown GPU"
}

// newHealthDebouncer asks the discovery loop for a rebuild, debounced.
func (d *Driver) newHealthDebouncer() *health.Debouncer {
	return health.NewDebouncer(clock.RealClock{}, d.cfg.HealthSettle, d.cfg.HealthInterval, func() {
		select {
		case d.rebuild <- struct{}{}:
		default:
		}
	})
}

// HealthRepublications returns how many times health changes asked for a
// republication (the debouncer's flushes), for tests and benchmarks.
func (d *Driver) HealthRepublications() int {
	if d.healthDebouncer == nil {
		return 0
	}
	return d.healthDebouncer.Flushes()
}
