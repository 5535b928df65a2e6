// Package metrics holds the kubelet plugin's Prometheus metrics, built with
// k8s.io/component-base/metrics as Kubernetes components build theirs, in a
// registry of their own that the plugin serves over HTTP (see Handler).
//
// Counters and histograms are updated as things happen; the gauges (claims
// prepared, devices published, MPS daemons running) are read from the
// plugin's state at each scrape, so they can never drift from it.
package metrics

import (
	"net/http"
	"strconv"
	"time"

	"k8s.io/component-base/metrics"
)

// Namespace prefixes every metric name.
const Namespace = "gpudra"

// Results of Prepare, Unprepare and checkpoint writes, as label values.
const (
	ResultSuccess = "success"
	ResultError   = "error"
)

// State is what the gauges show, read at each scrape.
type State struct {
	// PreparedClaims counts the claims prepared on the node; -1 when the
	// checkpoint cannot be read, and the gauge is left out.
	PreparedClaims int
	// PublishedDevices counts the published devices by type (gpu, mig,
	// vfio).
	PublishedDevices map[string]int
	// MPSDaemons counts the MPS control daemons the plugin supervises.
	MPSDaemons int
	// TaintedDevices counts the published devices with a taint, by the
	// taint's effect (NoSchedule, NoExecute).
	TaintedDevices map[string]int
	// CheckpointWrites and CheckpointWriteErrors count the writes of the
	// checkpoint file since the plugin started (one per group commit).
	CheckpointWrites, CheckpointWriteErrors int64
	// AdoptionPending says the checkpoint was lost and the claims on the
	// node are not adopted yet: Prepare and Unprepare wait for adoption.
	AdoptionPending bool
	// PreparedDevices are the devices of the prepared claims, one per
	// pod (or PodGroup) and request that uses them; nil when the
	// checkpoint cannot be read.
	PreparedDevices []PreparedDevice
}

// PreparedDevice is one device of a prepared claim as one pod uses it for
// one request: a series of gpudra_prepared_device_info. For a claim
// reserved for a PodGroup (KEP-5729), whose pods the plugin is not told,
// Pod is empty and PodGroup names the group.
type PreparedDevice struct {
	Namespace, Pod, PodGroup, Claim, Request, Device string
	// GPUUUID is the GPU's UUID, the parent's for a MIG device: DCGM
	// exporter's UUID label. Empty for a device that is no GPU (an IMEX
	// channel).
	GPUUUID string
	// MIGUUID is the MIG device's UUID, and GPUInstanceID its GPU instance
	// ID on the parent (DCGM exporter's GPU_I_ID); empty for a full GPU.
	MIGUUID, GPUInstanceID string
}

// The labels of gpudra_prepared_device_info. UUID and GPU_I_ID are
// spelled as DCGM exporter spells them, so that its series join the info
// metric on them with no label_replace. The info metric is the "many"
// side, since pods that share a GPU each have a series of it:
//
//	gpudra_prepared_device_info * on(UUID, GPU_I_ID) group_left DCGM_FI_DEV_GPU_UTIL
var preparedDeviceLabels = []string{"namespace", "pod", "pod_group", "claim", "request", "device", "UUID", "mig_uuid", "GPU_I_ID"}

// Plugin is the kubelet plugin's metrics.
type Plugin struct {
	registry metrics.KubeRegistry

	prepareDuration    *metrics.HistogramVec
	unprepareDuration  *metrics.HistogramVec
	slicePublishErrors *metrics.Counter
	healthEvents       *metrics.CounterVec
}

// durationBuckets span a Prepare that only answers from the checkpoint
// (under a millisecond) to one that creates a MIG device or starts an MPS
// daemon (seconds), up to the kubelet's call timeout.
var durationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 45}

// NewPlugin returns the plugin's metrics, registered; state is called at
// each scrape for the gauges.
func NewPlugin(state func() State) *Plugin {
	p := &Plugin{
		registry: metrics.NewKubeRegistry(),
		prepareDuration: metrics.NewHistogramVec(&metrics.HistogramOpts{
			Namespace:      Namespace,
			Name:           "prepare_duration_seconds",
			Help:           "Time to prepare one claim (NodePrepareResources, per claim), by result.",
			Buckets:        durationBuckets,
			StabilityLevel: metrics.ALPHA,
		}, []string{"result"}),
		unprepareDuration: metrics.NewHistogramVec(&metrics.HistogramOpts{
			Namespace:      Namespace,
			Name:           "unprepare_duration_seconds",
			Help:           "Time to unprepare one claim (NodeUnprepareResources, per claim), by result.",
			Buckets:        durationBuckets,
			StabilityLevel: metrics.ALPHA,
		}, []string{"result"}),
		slicePublishErrors: metrics.NewCounter(&metrics.CounterOpts{
			Namespace:      Namespace,
			Name:           "resourceslice_publish_errors_total",
			Help:           "Errors the ResourceSlice controller reported while publishing the node's devices.",
			StabilityLevel: metrics.ALPHA,
		}),
		healthEvents: metrics.NewCounterVec(&metrics.CounterOpts{
			Namespace:      Namespace,
			Name:           "health_events_total",
			Help:           "GPU health events seen, by event (xid, ecc-dbe, gpu-lost, recovered) and whether the policy ignored them (an application XID).",
			StabilityLevel: metrics.ALPHA,
		}, []string{"event", "ignored"}),
	}
	p.registry.MustRegister(p.prepareDuration, p.unprepareDuration, p.slicePublishErrors, p.healthEvents)
	p.registry.CustomMustRegister(newStateCollector(state))
	return p
}

// Handler serves the metrics in the Prometheus text format.
func (p *Plugin) Handler() http.Handler {
	return metrics.HandlerFor(p.registry, metrics.HandlerOpts{})
}

// Registry is the registry the metrics are in, for tests that gather them.
func (p *Plugin) Registry() metrics.KubeRegistry { return p.registry }

// ObservePrepare records one claim's Prepare.
func (p *Plugin) ObservePrepare(took time.Duration, err error) {
	p.prepareDuration.WithLabelValues(result(err)).Observe(took.Seconds())
}

// ObserveUnprepare records one claim's Unprepare.
func (p *Plugin) ObserveUnprepare(took time.Duration, err error) {
	p.unprepareDuration.WithLabelValues(result(err)).Observe(took.Seconds())
}

// HealthEvent counts a GPU health event.
func (p *Plugin) HealthEvent(event string, ignored bool) {
	p.healthEvents.WithLabelValues(event, strconv.FormatBool(ignored)).Inc()
}

// SlicePublishError counts an error of the ResourceSlice controller.
func (p *Plugin) SlicePublishError() { p.slicePublishErrors.Inc() }

func result(err error) string {
	if err != nil {
		return ResultError
	}
	return ResultSuccess
}

// stateCollector reports the gauges from the plugin's state.
type stateCollector struct {
	metrics.BaseStableCollector
	state func() State
}

var (
	preparedClaimsDesc = metrics.NewDesc(Namespace+"_prepared_claims",
		"Claims prepared on the node (completed in the checkpoint).", nil, nil, metrics.ALPHA, "")
	publishedDevicesDesc = metrics.NewDesc(Namespace+"_published_devices",
		"Devices published in the node's ResourceSlices, by type (gpu, mig, vfio).", []string{"type"}, nil, metrics.ALPHA, "")
	taintedDevicesDesc = metrics.NewDesc(Namespace+"_tainted_devices",
		"Published devices with a device taint (an unhealthy GPU's), by effect.", []string{"effect"}, nil, metrics.ALPHA, "")
	mpsDaemonsDesc = metrics.NewDesc(Namespace+"_mps_daemons",
		"MPS control daemons the plugin runs and supervises.", nil, nil, metrics.ALPHA, "")
	checkpointWritesDesc = metrics.NewDesc(Namespace+"_checkpoint_writes_total",
		"Writes of the checkpoint file since the plugin started (one per group commit), by result.", []string{"result"}, nil, metrics.ALPHA, "")
	adoptionPendingDesc = metrics.NewDesc(Namespace+"_checkpoint_adoption_pending",
		"1 while the checkpoint is lost and the claims on the node are not adopted yet (Prepare and Unprepare wait), else 0.", nil, nil, metrics.ALPHA, "")
	preparedDeviceDesc = metrics.NewDesc(Namespace+"_prepared_device_info",
		"A device of a prepared claim and the pod (or PodGroup) that uses it, for one request; always 1. Joins DCGM exporter's series on UUID and GPU_I_ID.", preparedDeviceLabels, nil, metrics.ALPHA, "")
)

func newStateCollector(state func() State) *stateCollector {
	return &stateCollector{state: state}
}

func (c *stateCollector) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- preparedClaimsDesc
	ch <- publishedDevicesDesc
	ch <- mpsDaemonsDesc
	ch <- taintedDevicesDesc
	ch <- checkpointWritesDesc
	ch <- preparedDeviceDesc
	ch <- adoptionPendingDesc
}

func (c *stateCollector) CollectWithStability(ch chan<- metrics.Metric) {
	s := c.state()
	if s.PreparedClaims >= 0 {
		ch <- metrics.NewLazyConstMetric(preparedClaimsDesc, metrics.GaugeValue, float64(s.PreparedClaims))
	}
	for typ, n := range s.PublishedDevices {
		ch <- metrics.NewLazyConstMetric(publishedDevicesDesc, metrics.GaugeValue, float64(n), typ)
	}
	ch <- metrics.NewLazyConstMetric(mpsDaemonsDesc, metrics.GaugeValue, float64(s.MPSDaemons))
	for _, effect := range []string{"NoSchedule", "NoExecute"} {
		ch <- metrics.NewLazyConstMetric(taintedDevicesDesc, metrics.GaugeValue, float64(s.TaintedDevices[effect]), effect)
	}
	ch <- metrics.NewLazyConstMetric(checkpointWritesDesc, metrics.CounterValue, float64(s.CheckpointWrites), ResultSuccess)
	ch <- metrics.NewLazyConstMetric(checkpointWritesDesc, metrics.CounterValue, float64(s.CheckpointWriteErrors), ResultError)
	pending := 0.0
	if s.AdoptionPending {
		pending = 1
	}
	ch <- metrics.NewLazyConstMetric(adoptionPendingDesc, metrics.GaugeValue, pending)
	for _, d := range s.PreparedDevices {
		ch <- metrics.NewLazyConstMetric(preparedDeviceDesc, metrics.GaugeValue, 1,
			d.Namespace, d.Pod, d.PodGroup, d.Claim, d.Request, d.Device, d.GPUUUID, d.MIGUUID, d.GPUInstanceID)
	}
}
