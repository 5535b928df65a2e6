// Package simnode runs one simulated GPU node in process: its Node object,
// gpudra's kubelet plugin on the node's simulated hardware, and the
// kubelet's own DRA code (the DRA manager from
// k8s.io/kubernetes/pkg/kubelet/cm/dra and the plugin manager watching the
// node's registration directory), driven by a small pod loop that stands
// in for the rest of the kubelet: containers are not run, but their
// claims are prepared and unprepared through the kubelet's real code over
// real gRPC sockets, and their CDI devices resolved with the CDI library.
package simnode

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	kubeletdra "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/deviceplugin"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/mps"
	"github.com/gpudra/gpudra/pkg/pluginflags"
	"github.com/gpudra/gpudra/pkg/simfleet"
	"github.com/gpudra/gpudra/pkg/timeslicing"
	"github.com/gpudra/gpudra/pkg/vfio/fakesysfs"

	"github.com/gpudra/gpudra/localcluster/baseline"
	"github.com/gpudra/gpudra/localcluster/simnic"
)

// Config describes one simulated node.
type Config struct {
	// Name is the node name.
	Name string
	// DriverName is gpudra's driver name.
	DriverName string
	// Hardware is the node's simulated hardware.
	Hardware hardware.Hardware
	// Dir is the node's root; it gets plugins/, plugins_registry/, cdi/
	// and dra/ (the kubelet's DRA state) below it. Unix socket paths must
	// stay under 108 bytes, so keep it short.
	Dir string
	// KubeletClient is what the node's kubelet parts (DRA manager, pod
	// loop) use; PluginClient is the plugin's. With PluginRESTConfig
	// instead, the plugin's client is made from it with the rate limits of
	// the plugin's --kube-api-qps and --kube-api-burst.
	KubeletClient    kubernetes.Interface
	PluginClient     kubernetes.Interface
	PluginRESTConfig *rest.Config
	// PluginArgs, if set, returns the command line of the node's plugin
	// pod with the given UID, `kubelet-plugin` and its flags (the Helm
	// chart's DaemonSet container's, see package install): the plugin's
	// configuration is parsed from it with the command's own flag set
	// (package pluginflags). What the flags cannot say comes from this
	// Config: the simulated hardware, VFIO's fake sysfs, the time slices,
	// the fake MPS binary, no driver files in CDI specs; and the fleet's
	// per-node MIGMode and Sharing, where set, win over the flags (on a
	// cluster, a values file per node pool). Unset: the node's directories
	// and DriverName, every other flag at its default.
	PluginArgs func(podUID string) ([]string, error)
	// Workers is how many pods the loop handles at once (default
	// DefaultWorkers).
	Workers int
	// Labels are added to the Node.
	Labels map[string]string
	// MIGMode is the plugin's MIG mode (empty: its default, dynamic).
	MIGMode draplugin.MIGMode
	// MIGModeSwitching is the plugin's --mig-mode-switching.
	MIGModeSwitching bool
	// Sysfs, if set, is the node's PCI side for VFIO passthrough (a fake
	// that models the kernel); the plugin then offers the GPUs for
	// passthrough beside their CUDA devices.
	Sysfs *fakesysfs.Sysfs
	// Sharing is how the node's plugin shares full GPUs (--sharing).
	Sharing devicemodel.Sharing
	// MPSControlBinary, if set, is the nvidia-cuda-mps-control the node's
	// plugin runs MPS daemons with (a fake: see internal/mpsfake); without
	// it the node refuses MPS claims.
	MPSControlBinary string
	// KubeletTLS, if set, is the TLS config of the node's kubelet API
	// server (its serving certificate), which
	// answers kube-apiserver's pods/log, exec, attach and port-forward
	// requests on 127.0.0.1; the Node's status points there. Without it
	// the node serves no kubelet API.
	KubeletTLS *tls.Config
	// KubeletVersion is the Node's status.nodeInfo.kubeletVersion.
	KubeletVersion string
	// Mode is which of gpudra's plugins serves the node's GPUs:
	// simfleet.ModeDRA (the default) or simfleet.ModeDevicePlugin,
	// gpudra's device plugin under the kubelet's own device manager.
	Mode string
	// DevicePlugin is the device plugin's config (NVIDIA's format), nil
	// for its defaults.
	DevicePlugin *deviceplugin.Config
	// NICs, if any, are the node's RDMA NICs, which the simulated NIC
	// driver (package simnic) serves beside gpudra's plugin.
	NICs []sim.NIC
	// Baseline, if set, is the driver name of a baseline driver (package
	// baseline) the node runs beside gpudra's plugin in ModeDRA, with the
	// devices and counter sets gpudra published: the load run's yardstick.
	Baseline string
}

// PodUIDLength is the length of the UIDs of the simulated plugin pods.
// Shorter than a real pod's UUID (36): the plugin names its DRA socket
// dra-<pod UID>.sock in its data directory, which on a simulated node lies
// deeper than /var/lib/kubelet/plugins, and a unix socket path must fit in
// 107 bytes.
const PodUIDLength = 8

// NewPodUID returns a new UID for a simulated plugin pod.
func NewPodUID() string { return string(uuid.NewUUID())[:PodUIDLength] }

// DefaultWorkers is how many pods a node's loop handles at once unless
// Config.Workers says otherwise.
const DefaultWorkers = 4

// Node is a running simulated node.
type Node struct {
	cfg      Config
	logger   klog.Logger
	ctx      context.Context
	cancel   context.CancelFunc
	node     *corev1.Node
	manager  *dra.Manager
	plugins  *kubeletdra.DRAPluginManager
	pmStop   chan struct{}
	pmDone   chan struct{}
	recorder record.EventRecorder
	stopRec  func()
	loop     *podLoop

	pluginMu sync.Mutex
	plugin   *draplugin.Driver
	// podUID is the UID of the plugin's pod: its --pod-uid, kept across
	// restarts of the plugin (a container restart keeps its pod).
	podUID string
	// mps is the MPS manager of the running plugin, nil without MPS.
	mps *mps.Manager
	// baseline is the baseline driver, nil without Config.Baseline.
	baseline *baseline.Driver
	// imex is the channel plugin's IMEX side.
	imex imexState

	// api serves the kubelet API, nil without Config.KubeletTLS.
	api *kubeletServer
	// metrics serves the running plugin's metrics on loopback.
	metrics *metricsServer

	// devices is the kubelet's device manager and devicePlugin gpudra's
	// device plugin, on a node in ModeDevicePlugin.
	devMu        sync.Mutex
	admitMu      sync.Mutex
	devices      *devicemanager.ManagerImpl
	devicePlugin *deviceplugin.Plugin
	// stopDevicePlugin stops the device plugin and waits for it.
	stopDevicePlugin func()
	// syncedCapacity is the device manager's capacity last written to the
	// Node, rendered.
	syncedCapacity string

	// timeSlices holds the simulated GPUs' time-slice intervals; mpsRoot
	// the node's MPS daemon directories (short: sockets live there).
	timeSlices *timeslicing.Memory
	mpsRoot    string

	// nics is the NIC driver, nil on a node without NICs.
	nics *simnic.Driver
}

// Directories of a node.
func (c *Config) pluginDir() string   { return filepath.Join(c.Dir, "plugins", c.DriverName) }
func (c *Config) registryDir() string { return filepath.Join(c.Dir, "plugins_registry") }
func (c *Config) stateDir() string    { return filepath.Join(c.Dir, "dra") }

// CDIDir is where the node's plugin writes CDI specs.
func (c *Config) CDIDir() string { return filepath.Join(c.Dir, "cdi") }

// Start registers the Node, starts the kubelet's DRA manager and plugin
// manager, then gpudra's plugin, and waits until the plugin is registered
// with the DRA manager and its ResourceSlices are published; then the pod
// loop starts. Everything runs until Stop.
func Start(ctx context.Context, cfg Config) (_ *Node, finalErr error) {
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultWorkers
	}
	for _, dir := range []string{cfg.pluginDir(), cfg.registryDir(), cfg.stateDir(), cfg.CDIDir()} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, err
		}
	}
	logger := klog.FromContext(ctx).WithName("node").WithValues("node", cfg.Name)
	runCtx, cancel := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), logger))
	n := &Node{cfg: cfg, logger: logger, ctx: runCtx, cancel: cancel, timeSlices: &timeslicing.Memory{}, podUID: NewPodUID()}
	if cfg.MPSControlBinary != "" {
		// Not under Dir: the daemons' sockets must stay under 108 bytes.
		dir, err := os.MkdirTemp("/tmp", "gpudra-mps-")
		if err != nil {
			cancel()
			return nil, err
		}
		n.mpsRoot = dir
	}
	defer func() {
		if finalErr != nil {
			n.Stop()
		}
	}()

	broadcaster := record.NewBroadcaster(record.WithContext(runCtx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cfg.KubeletClient.CoreV1().Events("")})
	n.recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: cfg.Name})
	n.stopRec = broadcaster.Shutdown

	port := 0
	if cfg.KubeletTLS != nil {
		api, err := startKubeletServer(n, cfg.KubeletTLS)
		if err != nil {
			return nil, fmt.Errorf("node %s: kubelet API: %w", cfg.Name, err)
		}
		n.api, port = api, api.port()
	}
	var err error
	// gpudra's device plugin serves no HTTP endpoint; its DRA plugin
	// does (metrics and probes).
	if cfg.Mode != simfleet.ModeDevicePlugin {
		if n.metrics, err = startMetricsServer(n); err != nil {
			return nil, fmt.Errorf("node %s: metrics: %w", cfg.Name, err)
		}
	}
	if n.node, err = registerNode(ctx, cfg, port); err != nil {
		return nil, err
	}

	n.loop = newPodLoop(n)
	if n.manager, err = dra.NewManager(logger, cfg.KubeletClient, cfg.stateDir()); err != nil {
		return nil, fmt.Errorf("node %s: DRA manager: %w", cfg.Name, err)
	}
	getNode := func(context.Context) (*corev1.Node, error) { return n.node, nil }
	if err := n.manager.Start(runCtx, n.loop.activePods, getNode, n.loop.sourcesReady); err != nil {
		return nil, fmt.Errorf("node %s: start DRA manager: %w", cfg.Name, err)
	}
	handler := n.manager.GetWatcherHandler()
	n.plugins, _ = handler.(*kubeletdra.DRAPluginManager)
	pm := pluginmanager.NewPluginManager(cfg.registryDir(), n.recorder)
	pm.AddHandler("DRAPlugin", handler)
	n.pmStop, n.pmDone = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(n.pmDone)
		pm.Run(runCtx, n.loop.sourcesReady, n.pmStop)
	}()

	switch cfg.Mode {
	case simfleet.ModeDevicePlugin:
		if err := n.startDeviceManager(); err != nil {
			return nil, err
		}
		if err := n.startDevicePlugin(ctx); err != nil {
			return nil, err
		}
	case "", simfleet.ModeDRA:
		if err := n.StartPlugin(ctx); err != nil {
			return nil, err
		}
		if cfg.Baseline != "" {
			if err := n.startBaseline(ctx); err != nil {
				return nil, err
			}
		}
	default:
		return nil, fmt.Errorf("node %s: mode %q: must be %s or %s", cfg.Name, cfg.Mode, simfleet.ModeDRA, simfleet.ModeDevicePlugin)
	}
	if err := n.startNICDriver(ctx); err != nil {
		return nil, err
	}
	n.loop.start(runCtx)
	return n, nil
}

// registerNode creates (or takes over) the Node with room for many pods,
// a Ready condition, and, if kubeletPort is not 0, the addresses and port
// kube-apiserver reaches its kubelet API at.
func registerNode(ctx context.Context, cfg Config, kubeletPort int) (*corev1.Node, error) {
	labels := map[string]string{corev1.LabelHostname: cfg.Name, corev1.LabelOSStable: "linux", corev1.LabelArchStable: "amd64"}
	for k, v := range cfg.Labels {
		labels[k] = v
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse("224"),
		corev1.ResourceMemory: resource.MustParse("2Ti"),
		corev1.ResourcePods:   resource.MustParse("1000"),
	}
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: cfg.Name, Labels: labels},
	}
	client := cfg.KubeletClient.CoreV1().Nodes()
	created, err := client.Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = client.Get(ctx, cfg.Name, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("register node %s: %w", cfg.Name, err)
	}
	now := metav1.Now()
	created.Status = corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Phase:       corev1.NodeRunning,
		Conditions: []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "simulated node is ready", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "127.0.0.1"},
			{Type: corev1.NodeHostName, Address: cfg.Name},
		},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(kubeletPort)}},
		NodeInfo: corev1.NodeSystemInfo{
			KubeletVersion: cfg.KubeletVersion, OperatingSystem: "linux", Architecture: "amd64",
			ContainerRuntimeVersion: "simulated://0",
		},
	}
	updated, err := client.UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("node %s status: %w", cfg.Name, err)
	}
	return updated, nil
}

// Hardware returns the node's simulated hardware, which outlives plugin
// restarts.
func (n *Node) Hardware() hardware.Hardware { return n.cfg.Hardware }

// StartPlugin starts gpudra's kubelet plugin on the node's directories and
// waits until the DRA manager has it registered and its ResourceSlices
// are published.
func (n *Node) StartPlugin(ctx context.Context) error {
	n.pluginMu.Lock()
	defer n.pluginMu.Unlock()
	if n.plugin != nil {
		return errors.New("plugin already running")
	}
	cfg, err := n.pluginConfig(n.podUID)
	if err != nil {
		return fmt.Errorf("node %s: plugin: %w", n.cfg.Name, err)
	}
	var d *draplugin.Driver
	labeled(n.ctx, n.cfg.DriverName, func(ctx context.Context) { d, err = draplugin.Start(ctx, cfg) })
	if err != nil {
		return fmt.Errorf("node %s: start plugin: %w", n.cfg.Name, err)
	}
	n.plugin, n.mps = d, cfg.MPS
	return n.waitForPlugin(ctx)
}

// pluginConfig returns the configuration of the node's plugin in the pod
// with the given UID: parsed from its command line, with the simulated
// node's parts (see Config.PluginArgs).
func (n *Node) pluginConfig(podUID string) (draplugin.Config, error) {
	args := []string{"kubelet-plugin",
		"--driver-name=" + n.cfg.DriverName,
		"--node-name=" + n.cfg.Name,
		"--plugin-data-dir=" + n.cfg.pluginDir(),
		"--registrar-dir=" + n.cfg.registryDir(),
		"--cdi-dir=" + n.cfg.CDIDir(),
	}
	if n.cfg.PluginArgs != nil {
		var err error
		if args, err = n.cfg.PluginArgs(podUID); err != nil {
			return draplugin.Config{}, err
		}
	}
	if len(args) == 0 || args[0] != "kubelet-plugin" {
		return draplugin.Config{}, fmt.Errorf("command line %q: want gpudra kubelet-plugin", args)
	}
	flags, fs, err := pluginflags.ParseKubeletPlugin(args[1:])
	if err != nil {
		return draplugin.Config{}, err
	}
	// The kubelet finds the plugin where it looks: the node's directories.
	for _, f := range []struct{ flag, got, want string }{
		{"--node-name", flags.NodeName, n.cfg.Name},
		{"--driver-name", flags.DriverName, n.cfg.DriverName},
		{"--plugin-data-dir", flags.PluginDataDir, n.cfg.pluginDir()},
		{"--registrar-dir", flags.RegistrarDir, n.cfg.registryDir()},
		{"--cdi-dir", flags.CDIDir, n.cfg.CDIDir()},
	} {
		if f.got != f.want {
			return draplugin.Config{}, fmt.Errorf("%s %q: the simulated node's is %q", f.flag, f.got, f.want)
		}
	}
	host := pluginflags.Host{
		Hardware:       n.cfg.Hardware,
		TimeSlicer:     n.timeSlices,
		DriverEdits:    cdi.NoDriverEdits{},
		MPSUnavailable: "the simulated node has no MPS control binary",
	}
	if s := n.cfg.Sysfs; s != nil {
		host.VFIO = &draplugin.VFIOConfig{FS: s, Busy: s, Modules: s}
	} else {
		host.NoVFIO = true
	}
	if n.cfg.MPSControlBinary != "" {
		// A new manager per plugin start, as a restarted plugin process
		// would have: it adopts the daemons its predecessor started.
		m, err := mps.New(n.mpsRoot, mps.WithControlBinary(n.cfg.MPSControlBinary))
		if err != nil {
			return draplugin.Config{}, fmt.Errorf("MPS: %w", err)
		}
		host.MPS, host.MPSUnavailable = m, ""
	}
	client := n.cfg.PluginClient
	if n.cfg.PluginRESTConfig != nil {
		rc := rest.CopyConfig(n.cfg.PluginRESTConfig)
		rc.QPS, rc.Burst = flags.KubeAPIQPS, flags.KubeAPIBurst
		if client, err = kubernetes.NewForConfig(rc); err != nil {
			return draplugin.Config{}, err
		}
	}
	cfg, err := flags.Config(fs, client, host)
	if err != nil {
		return draplugin.Config{}, err
	}
	if n.cfg.MIGMode != "" {
		cfg.MIGMode = n.cfg.MIGMode
	}
	if n.cfg.MIGModeSwitching {
		cfg.MIGModeSwitching = true
	}
	if n.cfg.Sharing != (devicemodel.Sharing{}) {
		cfg.Sharing = n.cfg.Sharing
	}
	return cfg, nil
}

// waitForPlugin waits until gpudra's plugin is registered with the DRA
// manager and has published its devices.
func (n *Node) waitForPlugin(ctx context.Context) error {
	plugin := n.plugin
	return n.waitForDriver(ctx, n.cfg.DriverName, func() int { return len(plugin.Devices()) })
}

// waitForDriver waits until the DRA manager has the driver registered and
// the node's slices of the driver hold the devices the driver publishes
// now: want is asked at every look, since a plugin that falls back (an API
// server without a feature it uses) publishes other devices than at its
// start.
func (n *Node) waitForDriver(ctx context.Context, driver string, want func() int) error {
	var last int
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		last = want()
		if n.plugins != nil {
			if _, err := n.plugins.GetPlugin(driver); err != nil {
				return false, nil
			}
		}
		slices, err := n.cfg.KubeletClient.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: "spec.nodeName=" + n.cfg.Name,
		})
		if err != nil {
			return false, nil
		}
		got := 0
		for _, s := range slices.Items {
			if s.Spec.Driver == driver {
				got += len(s.Spec.Devices)
			}
		}
		return got == last, nil
	})
	if err != nil {
		return fmt.Errorf("node %s: driver %s not registered with its %d devices published: %w", n.cfg.Name, driver, last, err)
	}
	return nil
}

// StopPlugin stops the node's plugin, as when its pod is deleted; the
// kubelet side notices the socket going away and unregisters it.
func (n *Node) StopPlugin() {
	n.pluginMu.Lock()
	defer n.pluginMu.Unlock()
	if n.plugin != nil {
		n.plugin.Stop()
		n.plugin, n.mps = nil, nil
	}
}

// RestartPlugin stops the plugin and starts a new one on the same
// directories, as after a crash or an upgrade.
func (n *Node) RestartPlugin(ctx context.Context) error {
	n.StopPlugin()
	return n.StartPlugin(ctx)
}

// UpgradePlugin rolls the node's plugin to a new pod, as the chart's
// DaemonSet rolls (maxSurge 1, maxUnavailable 0): the new pod's plugin,
// with a new --pod-uid and so sockets of its own, starts beside the old
// one on the same data directory; once the kubelet has it registered the
// old one stops. The kubelet calls whichever plugin is registered last at
// every moment. It returns how long the two ran side by side.
func (n *Node) UpgradePlugin(ctx context.Context) (time.Duration, error) {
	n.pluginMu.Lock()
	defer n.pluginMu.Unlock()
	if n.plugin == nil {
		return 0, errors.New("no plugin running")
	}
	var before *kubeletdra.DRAPlugin
	if n.plugins != nil {
		before, _ = n.plugins.GetPlugin(n.cfg.DriverName)
	}
	uid := NewPodUID()
	cfg, err := n.pluginConfig(uid)
	if err != nil {
		return 0, fmt.Errorf("node %s: new plugin: %w", n.cfg.Name, err)
	}
	start := time.Now()
	var d *draplugin.Driver
	labeled(n.ctx, n.cfg.DriverName, func(ctx context.Context) { d, err = draplugin.Start(ctx, cfg) })
	if err != nil {
		return 0, fmt.Errorf("node %s: start new plugin: %w", n.cfg.Name, err)
	}
	// Ready when the kubelet's DRA manager calls the new one.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		if n.plugins == nil {
			return true, nil
		}
		p, err := n.plugins.GetPlugin(n.cfg.DriverName)
		return err == nil && p != before, nil
	})
	if err != nil {
		d.Stop()
		return 0, fmt.Errorf("node %s: the new plugin was not registered: %w", n.cfg.Name, err)
	}
	n.plugin.Stop()
	n.plugin, n.mps, n.podUID = d, cfg.MPS, uid
	return time.Since(start), nil
}

// DRACallFailures returns how many of the kubelet's PrepareResources and
// UnprepareResources calls on this node failed (the kubelet retries each).
func (n *Node) DRACallFailures() (prepare, unprepare int64) {
	return n.loop.prepareFailures.Load(), n.loop.unprepareFailures.Load()
}

// Name returns the node name.
func (n *Node) Name() string { return n.cfg.Name }

// CDIDir returns the directory of the node's CDI specs.
func (n *Node) CDIDir() string { return n.cfg.CDIDir() }

// PluginDataDir returns the plugin's data directory (socket, checkpoint).
func (n *Node) PluginDataDir() string { return n.cfg.pluginDir() }

// Containers returns what the node prepared for a pod's containers, by
// container name, once the pod runs.
func (n *Node) Containers(pod *corev1.Pod) (map[string]ContainerDevices, bool) {
	return n.loop.containers(pod.UID)
}

// Stop stops the pod loop, the plugin and the kubelet parts, in that
// order, and waits for them. The node's directories stay.
func (n *Node) Stop() {
	if n.api != nil {
		n.api.stop()
	}
	if n.metrics != nil {
		n.metrics.stop()
	}
	if n.loop != nil {
		n.loop.stop()
	}
	n.StopPlugin()
	if n.nics != nil {
		n.nics.Stop()
	}
	if n.baseline != nil {
		n.baseline.Stop()
	}
	if n.pmStop != nil {
		close(n.pmStop)
	}
	n.cancel()
	if n.pmDone != nil {
		<-n.pmDone
	}
	if n.manager != nil {
		n.manager.Stop()
	}
	if dm := n.deviceManager(); dm != nil {
		_ = dm.Stop(n.logger)
	}
	if n.stopRec != nil {
		n.stopRec()
	}
	// The fake MPS daemons of claims still prepared exit once their
	// directories are gone.
	if n.mpsRoot != "" {
		_ = os.RemoveAll(n.mpsRoot)
	}
}

// Sysfs returns the node's fake sysfs, nil if it has none.
func (n *Node) Sysfs() *fakesysfs.Sysfs { return n.cfg.Sysfs }

// TimeSlice returns the time-slice interval last set on the simulated GPU
// with the given UUID, and false if none was set.
func (n *Node) TimeSlice(gpuUUID string) (v1beta1.TimeSliceInterval, bool) {
	return n.timeSlices.Interval(gpuUUID)
}

// MPSDirs returns the directories of the node's MPS daemon with the given
// ID (a claim UID).
func (n *Node) MPSDirs(id string) mps.Dirs {
	return mps.DirsOf(n.mpsRoot, id)
}
