package draplugin

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
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

// healthMonitor watches the hardware's GPU health: it applies the events to
// the published devices (package devicehealth), republishes debounced, and
// reports the devices' health to the kubelet (healthreport.go).
type healthMonitor struct {
	d *Driver
	// debouncer debounces republications for health changes; nil when the
	// hardware reports no health.
	debouncer *health.Debouncer
	// signal wakes the kubelet's health streams; watching says whether the
	// hardware's health watcher runs.
	signal   healthSignal
	watching atomic.Bool
	// reportedGPU maps each device published or reported to the kubelet
	// to its GPU's UUID, so that withdrawn devices of an unhealthy GPU stay
	// reported, also on a health stream opened after the withdrawal.
	mu          sync.Mutex
	reportedGPU map[string]string
}

// loop applies the hardware's health events to the published
// devices (package devicehealth) until ctx ends. A change of some GPU's
// taints asks the discovery loop to rebuild and republish, debounced (see
// health.Debouncer): a flapping GPU causes at most one republication per
// HealthInterval. When the watcher cannot run (NVML missing), it is
// started again with the discovery loop's backoff.
func (m *healthMonitor) loop(ctx context.Context, w hardware.HealthWatcher) {
	logger := klog.FromContext(ctx)
	deb := m.debouncer
	defer deb.Stop()
	events := make(chan hardware.HealthEvent, 64)
	delay := minRetryDelay
	for {
		done := make(chan error, 1)
		if !m.watching.Swap(true) {
			m.signal.notify()
		}
		go func() { done <- w.WatchHealth(ctx, events) }()
		var err error
	watch:
		for {
			select {
			case e := <-events:
				m.onEvent(ctx, e, deb)
			case err = <-done:
				break watch
			}
		}
		if ctx.Err() != nil {
			return
		}
		m.watching.Store(false)
		m.signal.notify()
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

// onEvent applies one health event, logs it, and records a Node
// event when a GPU's taints change.
func (m *healthMonitor) onEvent(ctx context.Context, e hardware.HealthEvent, deb *health.Debouncer) {
	d := m.d
	logger := klog.FromContext(ctx).WithValues("gpu", e.GPUUUID, "device", m.gpuDeviceName(e.GPUUUID), "event", e.String())
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
	m.signal.notify()
	how := "withdrawn from the ResourceSlices (the API server lacks device taints)"
	if d.features.Health.Tainting() {
		how = "tainted " + describeTaints(t.After, d.cfg.DriverName, policy)
	}
	if t.After.Healthy() {
		logger.Info("GPU recovered; its devices are published untainted again", "was", t.Before.String())
		d.Event(corev1.EventTypeNormal, ReasonGPURecovered,
			fmt.Sprintf("GPU %s (%s) recovered (%s); it was %s; its devices are offered again", e.GPUUUID, m.gpuDeviceName(e.GPUUUID), e.Detail, t.Before))
		return
	}
	logger.Error(nil, "GPU unhealthy; its devices are "+how, "condition", t.After.String())
	d.Event(corev1.EventTypeWarning, ReasonGPUUnhealthy,
		fmt.Sprintf("GPU %s (%s) is unhealthy: %s; its devices are %s", e.GPUUUID, m.gpuDeviceName(e.GPUUUID), t.After, how))
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
func (m *healthMonitor) gpuDeviceName(uuid string) string {
	d := m.d
	for _, g := range d.current().Inventory.GPUs {
		if g.UUID == uuid {
			return devicemodel.GPUName(g.Minor)
		}
	}
	return "unknown GPU"
}

// newHealthDebouncer asks the discovery loop for a rebuild, debounced.
func (m *healthMonitor) newDebouncer() *health.Debouncer {
	d := m.d
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
	if d.healthMon.debouncer == nil {
		return 0
	}
	return d.healthMon.debouncer.Flushes()
}
