// Package plugin is the kubelet-plugin shell of gpudra: it wires hardware
// discovery, the device model, the claim state machine, the checkpoint and
// the CDI writer to the kubelet through
// k8s.io/dynamic-resource-allocation/kubeletplugin.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/utils/keymutex"

	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/checkpoint"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/devicestatus"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/mps"
	"github.com/gpudra/gpudra/pkg/timeslice"
	"github.com/gpudra/gpudra/pkg/vfio"
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
	TimeSlicer timeslice.Setter
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

	// PluginDataDir holds the DRA socket and the checkpoint.
	PluginDataDir string
	// RegistrarDir is the kubelet's plugin registration directory.
	RegistrarDir string
	// CDIDir is where per-claim CDI specs are written.
	CDIDir string
	// RollingUpdateUID, when set (the pod UID), lets two plugin instances
	// serve side by side during an upgrade.
	RollingUpdateUID types.UID

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
	// Faults, if set, is called before each step of a preparation and may
	// fail it; for crash tests only.
	Faults func(step Step, claimUID string) error
	// Clock, if set, replaces time.Now (tests).
	Clock func() time.Time
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

// claimLockBuckets is the number of per-claim locks. The default of
// keymutex (one per CPU) would let only two claims of a 2-core node prepare
// at once and defeat the checkpoint's group commit; with 4096 buckets two
// concurrent claims share a lock rarely, and then only wait for each other.
const claimLockBuckets = 4096

// nodeState is one discovery result and the devices derived from it.
type nodeState struct {
	inv   *hardware.Inventory
	model *devicemodel.Model
	// unknownMIG lists, by GPU UUID, the MIG instances of unknown
	// ownership that kept a GPU out of the dynamic MIG devices.
	unknownMIG map[string][]string
}

// Driver is gpudra's kubelet plugin. It implements [kubeletplugin.DRAPlugin].
type Driver struct {
	cfg      Config
	logger   klog.Logger
	helper   *kubeletplugin.Helper
	store    *checkpoint.Store
	cdi      *cdi.Writer
	recorder record.EventRecorder
	nodeRef  *corev1.ObjectReference

	state atomic.Pointer[nodeState]
	// mig creates and destroys MIG devices; dynamicMIG says whether the
	// node publishes dynamic MIG devices now (it stops when the API server
	// lacks partitionable devices).
	mig        hardware.MIGManager
	dynamicMIG atomic.Bool
	// migSwitcher switches MIG modes; nil unless MIGModeSwitching.
	migSwitcher hardware.MIGModeSwitcher
	// rebuild asks the discovery loop to rebuild and republish the devices.
	rebuild chan struct{}
	// status writes claims' status.devices.
	status *devicestatus.Writer
	// claimLocks serializes Prepare and Unprepare per claim UID inside this
	// process; different claims proceed in parallel.
	claimLocks keymutex.KeyMutex
	// timeSliceMu serializes changes of GPUs' time slices.
	timeSliceMu sync.Mutex
	// vfio binds GPUs to VFIO; nil without Config.VFIO. vfioBeside says
	// whether VFIO devices are published beside CUDA devices now (it
	// stops when the API server lacks partitionable devices).
	vfio       *vfio.Binder
	vfioBeside atomic.Bool
	// sharing says whether full GPUs are published for sharing now (it
	// stops when the API server lacks consumable capacity).
	sharing atomic.Bool
	// adoptPending is set when the checkpoint was found unreadable while
	// running; adoptNow wakes the sweep to adopt the claims on the node.
	adoptPending atomic.Bool
	adoptNow     chan struct{}
	// sweepMu serializes sweeps; goneOnce holds the claims the last sweep
	// found gone from the API server.
	sweepMu  sync.Mutex
	goneOnce map[string]bool

	stopBroadcast func()
	cancel        context.CancelFunc
	wg            sync.WaitGroup
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
		cfg:        cfg,
		logger:     logger,
		claimLocks: keymutex.NewHashed(claimLockBuckets),
		cancel:     cancel,
		adoptNow:   make(chan struct{}, 1),
		rebuild:    make(chan struct{}, 1),
		goneOnce:   map[string]bool{},
		nodeRef:    &corev1.ObjectReference{APIVersion: "v1", Kind: "Node", Name: cfg.NodeName},
	}
	defer func() {
		if finalErr != nil {
			d.Stop()
		}
	}()
	d.startEvents()
	d.setUpMIGMode()
	if err := d.setUpVFIO(); err != nil {
		return nil, err
	}
	if err := cfg.Sharing.Validate(); err != nil {
		return nil, fmt.Errorf("plugin config: %w", err)
	}
	d.sharing.Store(cfg.Sharing.Enabled())
	var err error
	if d.status, err = devicestatus.NewWriter(cfg.KubeClient, cfg.DriverName, cfg.NodeName); err != nil {
		return nil, err
	}

	opts := []checkpoint.Option{checkpoint.WithCorruptHandler(d.onCorruptCheckpoint)}
	if cfg.BootIDPath != "" {
		opts = append(opts, checkpoint.WithBootIDPath(cfg.BootIDPath))
	}
	_, statErr := os.Stat(filepath.Join(cfg.PluginDataDir, checkpoint.FileName))
	checkpointMissing := errors.Is(statErr, fs.ErrNotExist)
	store, report, err := checkpoint.Open(ctx, cfg.PluginDataDir, opts...)
	if err != nil {
		return nil, fmt.Errorf("open checkpoint: %w", err)
	}
	d.store = store
	d.reportCheckpoint(report)

	if d.cdi, err = cdi.NewWriter(cfg.CDIDir, cfg.DriverName); err != nil {
		return nil, err
	}
	// The first discovery happens before registration, so that the kubelet
	// never calls Prepare on a plugin that does not know its devices yet.
	// A failure is not fatal: the pool is published empty and discovery
	// keeps trying in the background.
	inv, discoverErr := cfg.Hardware.Discover(ctx)
	if lost := report.Corrupt != nil || checkpointMissing; lost {
		// Specs on the node may belong to running pods, and MIG instances
		// to their claims: adopt them before anything is removed.
		if err := d.adoptSpecs(ctx); err != nil {
			return nil, fmt.Errorf("adopt claims after losing the checkpoint: %w", err)
		}
		if discoverErr == nil && d.dynamicMIG.Load() {
			if err := d.rebuildMIGOwnership(ctx, inv); err != nil {
				logger.Error(err, "Rebuilding the ownership of MIG instances after losing the checkpoint; instances not accounted for are kept and their GPUs left out")
			}
		}
	}
	d.removeOrphanSpecs(ctx)
	d.restoreSharing(ctx)
	if discoverErr == nil {
		discoverErr = d.install(ctx, inv)
	}

	helperOpts := []kubeletplugin.Option{
		kubeletplugin.DriverName(cfg.DriverName),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.KubeClient(cfg.KubeClient),
		kubeletplugin.PluginDataDirectoryPath(cfg.PluginDataDir),
		kubeletplugin.RegistrarDirectoryPath(cfg.RegistrarDir),
		// gpudra guards its own state: per-claim locks in process and the
		// checkpoint's flock across processes. The helper's global lock
		// would serialize the 32 claims of a node's pods for nothing.
		kubeletplugin.Serialize(false),
		// Device health reporting comes with its own issue.
		kubeletplugin.HealthService(false),
	}
	if cfg.RollingUpdateUID != "" {
		helperOpts = append(helperOpts, kubeletplugin.RollingUpdate(cfg.RollingUpdateUID))
	}
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
	d.wg.Add(2)
	go func() {
		defer d.wg.Done()
		d.discoveryLoop(ctx, discoverErr)
	}()
	go func() {
		defer d.wg.Done()
		d.sweepLoop(ctx)
	}()
	logger.Info("Kubelet plugin started", "devices", len(d.current().model.Devices), "pluginDataDir", cfg.PluginDataDir, "cdiDir", cfg.CDIDir)
	return d, nil
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
	if d.stopBroadcast != nil {
		d.stopBroadcast()
	}
}

// CheckpointWrites returns how many times the checkpoint file was written.
func (d *Driver) CheckpointWrites() int64 { return d.store.Writes() }

// Devices returns the devices the plugin currently publishes.
func (d *Driver) Devices() []resourceapi.Device {
	return d.current().model.APIDevices()
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
	if c.MIG == nil {
		c.MIG, _ = c.Hardware.(hardware.MIGManager)
	}
}

// setUpMIGMode decides whether the node starts in dynamic MIG mode.
func (d *Driver) setUpMIGMode() {
	d.mig = d.cfg.MIG
	switch {
	case d.cfg.MIGMode != MIGModeDynamic:
		d.logger.Info("Static MIG: publishing the MIG devices that exist; none is created or destroyed")
	case d.mig == nil:
		d.logger.Info("Static MIG: this hardware cannot create MIG devices")
	default:
		d.dynamicMIG.Store(true)
		if d.cfg.MIGModeSwitching {
			if d.migSwitcher, _ = d.cfg.Hardware.(hardware.MIGModeSwitcher); d.migSwitcher == nil {
				d.logger.Info("MIG mode switching asked for, but this hardware cannot switch MIG modes")
			}
		}
	}
}

func (d *Driver) now() time.Time { return d.cfg.Clock() }

func (d *Driver) current() *nodeState {
	if s := d.state.Load(); s != nil {
		return s
	}
	return &nodeState{inv: &hardware.Inventory{}, model: &devicemodel.Model{}}
}

// HandleError implements [kubeletplugin.DRAPlugin]. Publishing errors are
// logged with what the API server lacks; nothing here is fatal, because
// neither retrying nor restarting fixes a cluster's feature gates. When the
// API server dropped fields that a publishing choice depends on, the plugin
// falls back (see fallbacks) and publishes again.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	var dropped *resourceslice.DroppedFieldsError
	if !errors.As(err, &dropped) {
		utilruntime.HandleErrorWithContext(ctx, err, msg)
		return
	}
	disabled := dropped.DisabledFeatures()
	logger := klog.FromContext(ctx).WithValues("pool", dropped.PoolName, "sliceIndex", dropped.SliceIndex, "disabledFeatures", disabled)
	fellBack := false
	for _, f := range d.fallbacks() {
		if slices.Contains(disabled, f.feature) && f.on.Swap(false) {
			logger.Error(err, f.log)
			d.event(corev1.EventTypeWarning, f.reason, f.event)
			fellBack = true
		}
	}
	if fellBack {
		select {
		case d.rebuild <- struct{}{}:
		default:
		}
		return
	}
	logger.Error(err, "The API server dropped fields of a ResourceSlice; it lacks features gpudra uses")
	d.event(corev1.EventTypeWarning, "ResourceSliceFieldsDropped", fmt.Sprintf("API server dropped ResourceSlice fields; disabled features: %v", disabled))
}

// fallback is a publishing choice that needs an API feature: when the API
// server drops the feature's fields, the choice is turned off (on) and the
// devices are published without it, with a log line and a Node event.
type fallback struct {
	feature       string
	on            *atomic.Bool
	log           string
	reason, event string
}

// fallbacks are the plugin's publishing choices that depend on API
// features. Half-published devices would be worse than none: counter-less
// dynamic MIG devices let the scheduler hand out overlapping placements,
// counter-less VFIO devices a GPU both ways, and shareable GPUs without
// consumable capacity ignore their caps.
func (d *Driver) fallbacks() []fallback {
	return []fallback{
		{
			feature: "DRAPartitionableDevices", on: &d.dynamicMIG,
			log:    "The API server lacks partitionable devices (DRAPartitionableDevices): falling back to static MIG, publishing the MIG devices that exist",
			reason: "DynamicMIGUnavailable",
			event:  "The API server dropped the shared counters of the dynamic MIG devices (DRAPartitionableDevices off): gpudra falls back to static MIG and publishes the MIG devices that exist",
		},
		{
			feature: "DRAPartitionableDevices", on: &d.vfioBeside,
			log:    "The API server lacks partitionable devices (DRAPartitionableDevices): VFIO devices are no longer published beside the CUDA devices; run with --vfio=only to offer GPUs for passthrough without shared counters",
			reason: "VFIOUnavailable",
			event:  "The API server dropped the shared counters that keep VFIO and CUDA devices of one GPU apart (DRAPartitionableDevices off): gpudra stops publishing VFIO devices; --vfio=only offers GPUs for passthrough without counters",
		},
		{
			feature: "DRAConsumableCapacity", on: &d.sharing,
			log:    "The API server lacks consumable capacity (DRAConsumableCapacity): publishing full GPUs unshared instead of --sharing=" + d.cfg.Sharing.String(),
			reason: "GPUSharingUnavailable",
			event:  fmt.Sprintf("The API server dropped the consumable capacity of shared GPUs (DRAConsumableCapacity off): gpudra publishes the GPUs unshared instead of --sharing=%s", d.cfg.Sharing),
		},
	}
}

// WatchHealthStatus implements [kubeletplugin.DRAPlugin]. The health
// service is off (see Start), so the kubelet never calls it.
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
