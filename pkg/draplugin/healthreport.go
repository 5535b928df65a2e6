package draplugin

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/preparer"
)

// Device health reporting to the kubelet (KEP-4680, the DRAResourceHealth
// gRPC service): the kubelet shows each device's health in the
// allocatedResourcesStatus of the containers that use it.
const (
	// DefaultHealthReportInterval is how often the health of every
	// published device is sent again when nothing changed. The kubelet
	// reports a device as Unknown once its health is older than the
	// device's HealthCheckTimeout, so this must stay well below it.
	DefaultHealthReportInterval = 10 * time.Second
	// HealthCheckTimeout is the lease each report asks of the kubelet: the
	// kubelet's own default (pkg/kubelet/cm/dra DefaultHealthTimeout),
	// sent explicitly so that a change of that default changes nothing.
	HealthCheckTimeout = 30 * time.Second
)

// healthSignal wakes the kubelet's health streams when the devices'
// health may have changed. Each stream waits on the channel C returns; a
// notify closes it and makes a new one, so every stream wakes once.
type healthSignal struct {
	mu sync.Mutex
	ch chan struct{}
}

// C returns a channel that is closed at the next notify.
func (s *healthSignal) C() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

func (s *healthSignal) notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
	}
	s.ch = make(chan struct{})
}

// WatchHealthStatus implements [kubeletplugin.DRAPlugin]. It sends the
// health of every published device at once, again whenever a GPU's health
// or the published devices change, and at least every
// Config.HealthReportInterval, so the kubelet's lease (HealthCheckTimeout)
// never runs out while the plugin runs. A device is Unhealthy while its
// GPU (the parent GPU of a MIG device) has a fault the policy taints for,
// and Unknown while the hardware's health watcher is not running (it is
// being started again); otherwise Healthy. The helper serves this only
// when the hardware reports health (see Start).
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	logger := klog.FromContext(ctx)
	ticker := time.NewTicker(d.cfg.HealthReportInterval)
	defer ticker.Stop()
	for {
		// Take the channel before building the report, so that a change
		// made while the report is sent wakes the next round.
		changed := d.healthMon.signal.C()
		report := d.healthMon.report(time.Now())
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
		}
		logger.V(5).Info("Sent device health to the kubelet", "devices", len(report.Devices))
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-ticker.C:
		}
	}
}

// remember records the GPU of every device of a publication, before it
// is installed: a device withdrawn later (its GPU unhealthy where the API
// server lacks device taints) is then reported Unhealthy on every health
// stream, also one the kubelet opens after the withdrawal, which has never
// seen the device published.
func (m *healthMonitor) remember(pub *preparer.Published) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.reportedGPU == nil {
		m.reportedGPU = map[string]string{}
	}
	for i := range pub.Model.Devices {
		dev := &pub.Model.Devices[i]
		m.reportedGPU[dev.Name()] = dev.GPU.UUID
	}
}

// healthReport is the health of every published device as of now, and of
// the devices of unhealthy GPUs that were withdrawn from the slices (where
// the API server lacks device taints): pods may still hold them, and they
// should read Unhealthy rather than decay to Unknown.
func (m *healthMonitor) report(now time.Time) kubeletplugin.DeviceHealthReport {
	d := m.d
	pub := d.current()
	state := d.features.Health.State()
	watching := m.watching.Load()
	devices := make([]kubeletplugin.DeviceHealth, 0, len(pub.Model.Devices))
	report := func(name, gpuUUID string) {
		h := kubeletplugin.DeviceHealth{
			PoolName:           d.cfg.NodeName,
			DeviceName:         name,
			Health:             kubeletplugin.HealthStatusHealthy,
			LastUpdated:        now,
			HealthCheckTimeout: HealthCheckTimeout,
		}
		switch c := state.Condition(gpuUUID); {
		case !c.Healthy():
			h.Health = kubeletplugin.HealthStatusUnhealthy
			h.Message = "GPU " + gpuUUID + ": " + c.String()
		case !watching:
			h.Health = kubeletplugin.HealthStatusUnknown
			h.Message = "GPU health is not watched right now: the watcher stopped and is being started again"
		}
		devices = append(devices, h)
	}

	m.mu.Lock()
	defer m.mu.Unlock()
	if m.reportedGPU == nil {
		m.reportedGPU = map[string]string{}
	}
	published := make(map[string]bool, len(pub.Model.Devices))
	for i := range pub.Model.Devices {
		dev := &pub.Model.Devices[i]
		published[dev.Name()] = true
		m.reportedGPU[dev.Name()] = dev.GPU.UUID
		report(dev.Name(), dev.GPU.UUID)
	}
	for _, name := range slices.Sorted(maps.Keys(m.reportedGPU)) {
		uuid := m.reportedGPU[name]
		switch {
		case published[name]:
		case !state.Condition(uuid).Healthy():
			report(name, uuid)
		default:
			// Gone for another reason (a dynamic MIG device destroyed,
			// a GPU unbound): the kubelet lets it decay.
			delete(m.reportedGPU, name)
		}
	}
	return kubeletplugin.DeviceHealthReport{Devices: devices}
}
