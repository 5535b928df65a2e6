// Package draplugin is the kubelet-plugin shell of gpudra: it wires hardware
// discovery, the device model, the claim state machine, the checkpoint and
// the CDI writer to the kubelet through
// k8s.io/dynamic-resource-allocation/kubeletplugin.
package draplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/checkpoint"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/devicestatus"
	"github.com/gpudra/gpudra/pkg/features"
	"github.com/gpudra/gpudra/pkg/features/devicehealth"
	"github.com/gpudra/gpudra/pkg/features/vfio"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/health"
	"github.com/gpudra/gpudra/pkg/metrics"
	"github.com/gpudra/gpudra/pkg/mps"
	"github.com/gpudra/gpudra/pkg/preparer"
	"github.com/gpudra/gpudra/pkg/timeslicing"
)

// Config is what the kubelet plugin needs to run on one node.
type Config struct {
	// DriverName is the DRA driver name, e.g. "gpu.nvidia.com".
	DriverName string
	// NodeName is this node; it is also the pool name.
	NodeName string
	// KubeClient talks to the API server.
	KubeClient kubernetes.Interface
	// Hardware discovers the node's GPUs.
	Hardware hardware.Hardware
	// MIGMode is how GPUs with MIG mode on are offered; empty means
	// MIGModeDynamic.
	MIGMode MIGMode
	// MIG creates and destroys MIG devices in dynamic mode; nil means
	// Hardware, if it implements [hardware.MIGManager]. Without one, the
	// node runs in static mode.
	MIG hardware.MIGManager
	// MIGModeSwitching lets dynamic mode switch the MIG mode of Hopper and
	// newer GPUs at Prepare: such GPUs are offered both as a full GPU and
	// as MIG devices, whatever their mode. The switcher is Hardware, if it
	// implements [hardware.MIGModeSwitcher].
	MIGModeSwitching bool
	// DriverEdits supplies the driver files for CDI specs.
	DriverEdits cdi.DriverEdits
	// TimeSlicer sets the time-slice interval of full GPUs for claims with
	// sharing strategy TimeSlicing; nil refuses that strategy.
	TimeSlicer timeslicing.Setter
	// MPS runs the MPS control daemons of claims with sharing strategy
	// MPS; nil refuses that strategy, with MPSUnavailable as the reason.
	MPS            *mps.Manager
	MPSUnavailable string
	// MPSSuperviseInterval is how often MPS daemons are checked and
	// restarted if they died.
	MPSSuperviseInterval time.Duration
	// VFIO, if set, offers GPUs for VFIO passthrough.
	VFIO *VFIOConfig
	// Sharing publishes the node's full GPUs for several claims at once
	// (KEP-5075 consumable capacity); each capped share gets an MPS
	// daemon with its caps. The zero value shares nothing.
	Sharing devicemodel.Sharing
	// Features, if set, builds the node's features (configurators,
	// publishers) and the device model they publish, in place of the GPU
	// driver's built from the fields above: it is how one shell serves
	// both of gpudra's drivers (the ComputeDomain channel plugin passes
	// its own). The shell knows no feature either way.
	Features func(FeatureEnv) (*features.Set, error)

	// PluginDataDir holds the DRA socket and the checkpoint.
	PluginDataDir string
	// RegistrarDir is the kubelet's plugin registration directory.
	RegistrarDir string
	// CDIDir is where per-claim CDI specs are written.
	CDIDir string
	// RollingUpdateUID, when set (the pod UID), lets two plugin instances
	// serve side by side during an upgrade.
	RollingUpdateUID types.UID
	// DeviceMetadata writes, for every prepared device, a metadata file
	// (KEP-5304) that its containers read at
	// /var/run/kubernetes.io/dra-device-attributes/: the attributes it is
	// published with, and what Prepare set up (a MIG device's UUID).
	DeviceMetadata bool

	// DiscoveryInterval is how often the GPUs are discovered again once
	// discovery works; while it fails the plugin retries sooner.
	DiscoveryInterval time.Duration
	// CallTimeout is how long the kubelet waits for one Prepare call;
	// started preparations older than that are rolled back by the sweep,
	// and orphaned CDI specs younger than that are left alone.
	CallTimeout time.Duration
	// SweepInterval is how often stale claims are looked for.
	SweepInterval time.Duration

	// BootIDPath overrides /proc/sys/kernel/random/boot_id (tests).
	BootIDPath string
	// Faults, if set, is called before each of the preparer's own steps
	// and may fail it; for crash tests only (a configurator's steps are
	// failed with a failing configurator).
	Faults func(step Step, claimUID string) error
	// Clock, if set, replaces time.Now (tests).
	Clock func() time.Time

	// HealthPolicy says which health events taint a GPU's devices, and
	// how; the zero value means health.DefaultPolicy(). Health is watched
	// when Hardware implements [hardware.HealthWatcher].
	HealthPolicy health.Policy
	// HealthSettle and HealthInterval debounce the republication of health
	// changes (see health.Debouncer); zero means the defaults.
	HealthSettle, HealthInterval time.Duration
	// HealthReportInterval is how often the devices' health is sent to
	// the kubelet again when nothing changed; DefaultHealthReportInterval
	// when zero.
	HealthReportInterval time.Duration
}

// FeatureEnv is what the shell offers a Config.Features constructor.
type FeatureEnv struct {
	// DataDir is the plugin's data directory (Config.PluginDataDir).
	DataDir string
	// State reads the prepared claims from the checkpoint.
	State func(ctx context.Context) (*claimstate.State, error)
}

// Defaults for the timing fields of Config.
const (
	DefaultDiscoveryInterval = 60 * time.Second
	// DefaultCallTimeout matches the kubelet's timeout for DRA gRPC calls.
	DefaultCallTimeout   = 45 * time.Second
	DefaultSweepInterval = 60 * time.Second
	// DefaultMPSSuperviseInterval: a dead daemon is noticed within this.
	DefaultMPSSuperviseInterval = 5 * time.Second
)

// MIGMode is how a node offers the GPUs whose MIG mode is on.
type MIGMode string

const (
	// MIGModeDynamic publishes every profile at every placement of such a
	// GPU, with shared counters so that the scheduler never hands out
	// overlapping placements, and creates the MIG device at Prepare and
	// destroys it at Unprepare. It needs partitionable devices in the API
	// server; without them the plugin falls back to MIGModeStatic.
	MIGModeDynamic MIGMode = "dynamic"
	// MIGModeStatic publishes the MIG devices that exist (an operator's
	// layout) and never creates or destroys one.
	MIGModeStatic MIGMode = "static"
)

// MIGModes lists the valid modes.
var MIGModes = []MIGMode{MIGModeDynamic, MIGModeStatic}

// VFIOConfig is what VFIO passthrough needs on this node.
type VFIOConfig = vfio.Config

// Step names a point in the preparation of a claim at which the crash
// tests inject failures.
type Step = preparer.Step

// The preparer's steps, in order.
const (
	StepWriteCDISpec    = preparer.StepWriteCDISpec
	StepRecordCompleted = preparer.StepRecordCompleted
)

// Driver is gpudra's kubelet plugin. It implements [kubeletplugin.DRAPlugin].
// It is a shell: discovery and publishing (discovery.go), the preparer
// (package preparer) with the node's features (package features), the
// sweep (sweep.go), Node events (events.go) and metrics (metrics.go).
type Driver struct {
	cfg      Config
	logger   klog.Logger
	helper   *kubeletplugin.Helper
	store    *checkpoint.Store
	cdi      *cdi.Writer
	events   *events
	features *features.Set
	prep     *preparer.Preparer
	sweeper  *sweeper
	// metrics and what readiness needs (metrics.go).
	metrics   *metrics.Plugin
	published atomic.Bool
	// controllerStarted: publish handed the helper its first resources
	// (Start, then only the discovery loop calls publish).
	controllerStarted bool

	// state is the current publication.
	state atomic.Pointer[preparer.Published]
	// installed is what the last install derived a publication from
	// (discovery.go).
	installed atomic.Pointer[installInput]
	// unchangedDiscoveries counts the discoveries that found nothing to
	// publish anew.
	unchangedDiscoveries atomic.Int64
	// rebuild asks the discovery loop to rebuild and republish the devices.
	rebuild chan struct{}
	// status writes claims' status.devices; statusWrites tracks the
	// removals that run after Unprepare.
	status       *devicestatus.Writer
	statusWrites pendingWrites
	// healthMon watches GPU health and reports it to the kubelet
	// (health.go, healthreport.go).
	healthMon healthMonitor

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

var _ kubeletplugin.DRAPlugin = &Driver{}

// Start opens the checkpoint, discovers the GPUs, registers with the
// kubelet and publishes the node's ResourceSlices. It returns once the
// plugin serves; background discovery and the sweep run until ctx ends or
// Stop is called.
func Start(ctx context.Context, cfg Config) (_ *Driver, finalErr error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	logger := klog.FromContext(ctx).WithValues("driver", cfg.DriverName, "node", cfg.NodeName)
	ctx = klog.NewContext(ctx, logger)
	ctx, cancel := context.WithCancel(ctx)
	d := &Driver{
		cfg:     cfg,
		logger:  logger,
		cancel:  cancel,
		rebuild: make(chan struct{}, 1),
		events:  newEvents(cfg.KubeClient, cfg.NodeName),
	}
	d.healthMon.d = d
	d.metrics = metrics.NewPlugin(d.metricsState)
	defer func() {
		if finalErr != nil {
			d.Stop()
		}
	}()
	if err := d.setUpFeatures(); err != nil {
		return nil, err
	}
	// Before any device is built: what the API server would drop decides
	// what the first publication offers.
	d.probeAPIFeatures(ctx)
	var err error
	if d.status, err = devicestatus.NewWriter(cfg.KubeClient, cfg.DriverName, cfg.NodeName); err != nil {
		return nil, err
	}

	opts := []checkpoint.Option{
		checkpoint.WithCorruptHandler(d.onCorruptCheckpoint),
		checkpoint.WithPool(cfg.NodeName),
		checkpoint.WithClock(cfg.Clock), // adoption times, as the sweep reads them
		checkpoint.WithDriverName(cfg.DriverName),
		checkpoint.WithKnownRecords(preparer.RecordNames(d.features.Configurators)...),
	}
	if cfg.BootIDPath != "" {
		opts = append(opts, checkpoint.WithBootIDPath(cfg.BootIDPath))
	}
	if d.cdi, err = cdi.NewWriter(cfg.CDIDir, cfg.DriverName); err != nil {
		return nil, err
	}
	// A checkpoint missing beside claims' CDI specs was lost (deleted, or
	// an older process was killed): the store records that before it
	// writes anything, so a kill before the adoption below cannot leave
	// an empty checkpoint that the next process would trust.
	opts = append(opts, checkpoint.WithLossEvidence(d.cdiSpecsEvidence))
	store, report, err := checkpoint.Open(ctx, cfg.PluginDataDir, opts...)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint: %w", err)
	}
	d.store = store
	d.events.reportCheckpoint(logger, report)
	checkpointMissing := report.Missing

	if removed, err := d.cdi.RemoveStaleTemps(); err != nil {
		logger.Error(err, "Removing CDI spec temp files a killed plugin left behind")
	} else if len(removed) > 0 {
		logger.Info("Removed CDI spec temp files a killed plugin left behind", "files", removed)
	}
	d.prep = preparer.New(preparer.Config{
		DriverName:     cfg.DriverName,
		NodeName:       cfg.NodeName,
		Store:          store,
		CDI:            d.cdi,
		Node:           &node{d: d},
		Configurators:  d.features.Configurators,
		Clock:          cfg.Clock,
		Faults:         cfg.Faults,
		DeviceMetadata: cfg.DeviceMetadata,
	})
	d.sweeper = &sweeper{d: d, goneOnce: map[string]bool{}, present: map[string]recheck{}, adoptNow: make(chan struct{}, 1)}

	// The first discovery happens before registration, so that the kubelet
	// never calls Prepare on a plugin that does not know its devices yet.
	// A failure is not fatal: the pool is published empty and discovery
	// keeps trying in the background.
	inv, discoverErr := cfg.Hardware.Discover(ctx)
	if report.Corrupt != nil || checkpointMissing || store.NeedsAdoption() {
		// Specs on the node may belong to running pods, and MIG instances
		// to their claims: adopt them before anything is removed.
		var adoptInv *hardware.Inventory
		if discoverErr == nil {
			adoptInv = inv
		}
		if err := d.prep.Adopt(ctx, adoptInv); err != nil {
			// Not fatal: exiting would only restart the plugin into the
			// same failure. The checkpoint refuses every call until an
			// adoption works (also when it was merely missing, and in the
			// next process), and each Prepare, Unprepare and sweep tries
			// again and says why it fails; no spec is removed meanwhile.
			logger.Error(err, "Adopting the claims prepared on this node failed; every Prepare and Unprepare fails until it works, and each tries again")
			d.Event(corev1.EventTypeWarning, "ClaimAdoptionFailed",
				fmt.Sprintf("gpudra could not adopt the claims prepared on this node, so it prepares and unprepares nothing until it can: %v", err))
			if !store.NeedsAdoption() {
				if err := store.RequireAdoption(ctx, fmt.Sprintf("claims with CDI specs on this node could not be adopted: %v", err)); err != nil {
					return nil, fmt.Errorf("adopt claims after losing the checkpoint: %w", err)
				}
			}
		}
	}
	d.sweeper.removeOrphanSpecs(ctx)
	if err := d.prep.Restore(ctx); err != nil {
		logger.Error(err, "Restoring what prepared claims set up (time slices, MPS daemons); their records stay, and Prepare, Unprepare and supervision try again")
	}
	if discoverErr == nil {
		discoverErr = d.install(ctx, inv)
	}

	healthWatcher, _ := cfg.Hardware.(hardware.HealthWatcher)
	if d.features.Health == nil {
		healthWatcher = nil // the features taint nothing: no watch
	}
	helperOpts := []kubeletplugin.Option{
		kubeletplugin.DriverName(cfg.DriverName),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.KubeClient(cfg.KubeClient),
		kubeletplugin.PluginDataDirectoryPath(cfg.PluginDataDir),
		kubeletplugin.RegistrarDirectoryPath(cfg.RegistrarDir),
		// gpudra guards its own state: per-claim locks, in process and
		// across processes, and the checkpoint's flock. The helper's global
		// lock would serialize the 32 claims of a node's pods for nothing.
		kubeletplugin.Serialize(false),
		// The kubelet learns the devices' health (WatchHealthStatus)
		// where the hardware reports it; elsewhere it is not offered, so
		// the kubelet does not watch a stream that can say nothing.
		kubeletplugin.HealthService(healthWatcher != nil),
	}
	if cfg.RollingUpdateUID != "" {
		helperOpts = append(helperOpts, kubeletplugin.RollingUpdate(cfg.RollingUpdateUID))
	}
	helperOpts = append(helperOpts, deviceMetadataOptions(&cfg)...)
	if healthWatcher != nil {
		// Before the helper serves: the kubelet opens the health stream as
		// soon as the plugin registers, and a stream that started before
		// this would report every device Unknown until the next resend.
		d.healthMon.debouncer = d.healthMon.newDebouncer()
		d.healthMon.watching.Store(true)
	}
	removeStaleSockets(logger, cfg)
	if d.helper, err = kubeletplugin.Start(ctx, d, helperOpts...); err != nil {
		return nil, fmt.Errorf("start kubelet plugin helper: %w", err)
	}
	if err := d.publish(ctx); err != nil {
		return nil, err
	}

	if cfg.MPS != nil {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			cfg.MPS.Supervise(ctx, cfg.MPSSuperviseInterval)
		}()
	}
	if healthWatcher != nil {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.healthMon.loop(ctx, healthWatcher)
		}()
	} else {
		logger.Info("This hardware reports no GPU health; devices are never tainted")
	}
	d.wg.Add(2)
	go func() {
		defer d.wg.Done()
		d.discoveryLoop(ctx, discoverErr)
	}()
	go func() {
		defer d.wg.Done()
		d.sweeper.loop(ctx)
	}()
	logger.Info("Kubelet plugin started", "devices", len(d.current().Model.Devices), "pluginDataDir", cfg.PluginDataDir, "cdiDir", cfg.CDIDir)
	return d, nil
}

// cdiSpecsEvidence tells the checkpoint, when its file is missing, whether
// this driver's claims have CDI specs on the node ("" if none).
func (d *Driver) cdiSpecsEvidence() (string, error) {
	uids, err := d.cdi.PreparedClaimUIDs() // NVIDIA's specs too: adopted alike
	if err != nil || len(uids) == 0 {
		return "", err
	}
	return fmt.Sprintf("%d claims have CDI specs in %s", len(uids), d.cdi.Dir()), nil
}

// setUpFeatures builds the node's features from the config.
func (d *Driver) setUpFeatures() error {
	cfg := &d.cfg
	readState := func(ctx context.Context) (*claimstate.State, error) { return d.store.Read(ctx) }
	if cfg.Features != nil {
		set, err := cfg.Features(FeatureEnv{DataDir: cfg.PluginDataDir, State: readState})
		if err != nil {
			return fmt.Errorf("plugin config: %w", err)
		}
		d.features = set
		return nil
	}
	healthPublisher, err := devicehealth.New(cfg.DriverName, cfg.HealthPolicy)
	if err != nil {
		return fmt.Errorf("plugin config: %w", err)
	}
	o := features.Options{
		Health:         healthPublisher,
		MIG:            cfg.MIG,
		VFIO:           cfg.VFIO,
		TimeSlicer:     cfg.TimeSlicer,
		DataDir:        cfg.PluginDataDir,
		State:          readState,
		MPS:            cfg.MPS,
		MPSUnavailable: cfg.MPSUnavailable,
		Sharing:        cfg.Sharing,
		MIGModeNode:    modeSwitchNode{d},
	}
	switch {
	case cfg.MIGMode != MIGModeDynamic:
		d.logger.Info("Static MIG: publishing the MIG devices that exist; none is created or destroyed")
	case cfg.MIG == nil:
		d.logger.Info("Static MIG: this hardware cannot create MIG devices")
	default:
		o.DynamicMIG = true
		if cfg.MIGModeSwitching {
			if o.MIGModeSwitcher, _ = cfg.Hardware.(hardware.MIGModeSwitcher); o.MIGModeSwitcher == nil {
				d.logger.Info("MIG mode switching asked for, but this hardware cannot switch MIG modes")
			}
		}
	}
	set, err := features.New(o)
	if err != nil {
		return fmt.Errorf("plugin config: %w", err)
	}
	d.features = set
	return nil
}

// Stop unregisters from the kubelet and stops all background work. The
// ResourceSlices stay: the kubelet removes them if the plugin does not
// come back.
func (d *Driver) Stop() {
	if d == nil {
		return
	}
	if d.cancel != nil {
		d.cancel()
	}
	d.helper.Stop()
	d.wg.Wait()
	if d.store != nil {
		if err := d.store.Close(); err != nil {
			d.logger.Error(err, "Closing checkpoint")
		}
	}
	d.events.stop()
}

// CheckpointWrites returns how many times the checkpoint file was written.
func (d *Driver) CheckpointWrites() int64 { return d.store.Writes() }

// Devices returns the devices the plugin currently publishes.
func (d *Driver) Devices() []resourceapi.Device {
	return d.current().Model.APIDevices()
}

func (c *Config) validate() error {
	if c.MIGMode != "" && !slices.Contains(MIGModes, c.MIGMode) {
		return fmt.Errorf("plugin config: MIGMode %q is not one of %v", c.MIGMode, MIGModes)
	}
	var missing []string
	for name, empty := range map[string]bool{
		"DriverName": c.DriverName == "", "NodeName": c.NodeName == "", "KubeClient": c.KubeClient == nil,
		"Hardware": c.Hardware == nil, "PluginDataDir": c.PluginDataDir == "", "RegistrarDir": c.RegistrarDir == "",
		"CDIDir": c.CDIDir == "",
	} {
		if empty {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("plugin config: missing %v", missing)
	}
	return nil
}

// setDefaults fills in the optional fields left zero.
func (c *Config) setDefaults() {
	if c.DriverEdits == nil {
		c.DriverEdits = cdi.NoDriverEdits{}
	}
	if c.DiscoveryInterval <= 0 {
		c.DiscoveryInterval = DefaultDiscoveryInterval
	}
	if c.CallTimeout <= 0 {
		c.CallTimeout = DefaultCallTimeout
	}
	if c.SweepInterval <= 0 {
		c.SweepInterval = DefaultSweepInterval
	}
	if c.MPSSuperviseInterval <= 0 {
		c.MPSSuperviseInterval = DefaultMPSSuperviseInterval
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.MIGMode == "" {
		c.MIGMode = MIGModeDynamic
	}
	if c.HealthPolicy.FaultEffect == "" && c.HealthPolicy.LostEffect == "" && c.HealthPolicy.IgnoreXIDs == nil {
		c.HealthPolicy = health.DefaultPolicy()
	}
	if c.HealthSettle <= 0 {
		c.HealthSettle = health.DefaultSettle
	}
	if c.HealthInterval <= 0 {
		c.HealthInterval = health.DefaultInterval
	}
	if c.HealthReportInterval <= 0 {
		c.HealthReportInterval = DefaultHealthReportInterval
	}
	if c.MIG == nil {
		c.MIG, _ = c.Hardware.(hardware.MIGManager)
	}
}

func (d *Driver) current() *preparer.Published {
	if s := d.state.Load(); s != nil {
		return s
	}
	return &preparer.Published{Inventory: &hardware.Inventory{}, Model: &devicemodel.Model{}}
}

// HandleError implements [kubeletplugin.DRAPlugin]. Publishing errors are
// logged with what the API server lacks; nothing here is fatal, because
// neither retrying nor restarting fixes a cluster's feature gates. When the
// API server dropped fields that a publishing choice depends on, the plugin
// falls back (see fallbacks) and publishes again. The dry-run probe at
// start (probeAPIFeatures) falls back before the first publication; this
// is the second line, for an API server downgraded while the plugin runs.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	d.metrics.SlicePublishError()
	var dropped *resourceslice.DroppedFieldsError
	if !errors.As(err, &dropped) {
		utilruntime.HandleErrorWithContext(ctx, err, msg)
		return
	}
	disabled := dropped.DisabledFeatures()
	logger := klog.FromContext(ctx).WithValues("pool", dropped.PoolName, "sliceIndex", dropped.SliceIndex, "disabledFeatures", disabled)
	if d.fallBack(logger, err, disabled) {
		select {
		case d.rebuild <- struct{}{}:
		default:
		}
		return
	}
	logger.Error(err, "The API server dropped fields of a ResourceSlice; it lacks features gpudra uses")
	d.Event(corev1.EventTypeWarning, "ResourceSliceFieldsDropped", fmt.Sprintf("API server dropped ResourceSlice fields; disabled features: %v", disabled))
}
