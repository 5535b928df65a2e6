package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/metrics"
	"github.com/gpudra/gpudra/pkg/nodemode"
	"github.com/gpudra/gpudra/pkg/plugin"
	"github.com/gpudra/gpudra/pkg/version"
)

// Client rate limits. The kubeletplugin helper GETs every claim of every
// NodePrepareResources call from the API server; at client-go's default of
// 5 requests/s a node starting 32 pods would wait seconds for its own
// client. 50/s sustained with a burst of 100 lets a full node's pods start
// at once, and stays small next to the kubelet's own API traffic.
const (
	defaultKubeAPIQPS   = 50
	defaultKubeAPIBurst = 100
)

type kubeletPluginOptions struct {
	hw             discoveryFlags
	cdi            cdiFlags
	sharing        sharingFlags
	vfio           vfioFlags
	gpuSharing     gpuSharingFlags
	httpEndpoint   string
	metricsPath    string
	health         healthFlags
	driverName     string
	nodeName       string
	kubeconfig     string
	kubeAPIQPS     float32
	kubeAPIBurst   int
	pluginDataDir  string
	registrarDir   string
	devicePlugins  string
	cdiDir         string
	podUID         string
	discoveryEvery time.Duration
	sweepEvery     time.Duration
	callTimeout    time.Duration
	migMode        string
	migSwitching   bool
	logging        *logsapi.LoggingConfiguration
}

func newKubeletPluginCommand() *cobra.Command {
	o := &kubeletPluginOptions{logging: logsapi.NewLoggingConfiguration()}
	cmd := &cobra.Command{
		Use:   "kubelet-plugin",
		Short: "Run the node's DRA kubelet plugin: discover GPUs, publish ResourceSlices, prepare claims",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd)
		},
	}
	fs := cmd.Flags()
	o.hw.addFlags(fs)
	o.cdi.addFlags(fs)
	o.sharing.addFlags(fs)
	o.vfio.addFlags(fs)
	o.health.addFlags(fs)
	o.gpuSharing.addFlags(fs, "how full GPUs are shared between claims (KEP-5075 consumable capacity), one of none, memory-compute, shares=<N>, unlimited; a capped share gets an MPS daemon with its caps. See docs/sharing.md")
	fs.StringVar(&o.driverName, "driver-name", "gpu.nvidia.com", "DRA driver name; NVIDIA's DRA driver uses gpu.nvidia.com")
	fs.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "name of this node, also the pool name (env NODE_NAME)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file; in-cluster config when empty (env KUBECONFIG)")
	fs.Float32Var(&o.kubeAPIQPS, "kube-api-qps", defaultKubeAPIQPS, "sustained requests per second to the API server")
	fs.IntVar(&o.kubeAPIBurst, "kube-api-burst", defaultKubeAPIBurst, "burst of requests to the API server")
	fs.StringVar(&o.pluginDataDir, "plugin-data-dir", "", "directory for the DRA socket and the checkpoint (default /var/lib/kubelet/plugins/<driver-name>)")
	fs.StringVar(&o.registrarDir, "registrar-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registration directory")
	fs.StringVar(&o.devicePlugins, "device-plugin-dir", nodemode.DefaultDevicePluginDir, "the kubelet's device-plugin directory: the DRA plugin refuses to start while a device plugin for NVIDIA GPUs (gpudra's or NVIDIA's) listens there")
	fs.StringVar(&o.cdiDir, "cdi-dir", "/var/run/cdi", "directory for the per-claim CDI specs; the container runtime must read it")
	fs.StringVar(&o.podUID, "pod-uid", os.Getenv("POD_UID"), "UID of the plugin's pod; enables rolling updates with two instances side by side (env POD_UID)")
	fs.DurationVar(&o.discoveryEvery, "discovery-interval", plugin.DefaultDiscoveryInterval, "how often GPUs are discovered again (sooner while discovery fails)")
	fs.DurationVar(&o.sweepEvery, "sweep-interval", plugin.DefaultSweepInterval, "how often stale prepared claims and orphaned CDI specs are cleaned up")
	fs.DurationVar(&o.callTimeout, "kubelet-call-timeout", plugin.DefaultCallTimeout, "the kubelet's timeout for one DRA call; older unfinished preparations are rolled back")
	fs.StringVar(&o.migMode, "mig-mode", string(plugin.MIGModeDynamic), fmt.Sprintf("how GPUs with MIG mode on are offered, one of %v: dynamic publishes every profile at every placement and creates the MIG device at Prepare; static publishes the MIG devices that exist and never creates or destroys one", plugin.MIGModes))
	fs.StringVar(&o.httpEndpoint, "http-endpoint", "", "TCP address of the HTTP server for metrics and probes (e.g. :8080; /livez, /readyz and the metrics at --metrics-path); empty: no server")
	fs.StringVar(&o.metricsPath, "metrics-path", "/metrics", "HTTP path of the Prometheus metrics on --http-endpoint")
	fs.BoolVar(&o.migSwitching, "mig-mode-switching", false, "with --mig-mode=dynamic, offer Hopper and newer MIG-capable GPUs both as a full GPU and as MIG devices whatever their MIG mode, and switch the mode at Prepare as the allocated device needs")
	logsapi.AddFlags(o.logging, fs)
	return cmd
}

func (o *kubeletPluginOptions) run(cmd *cobra.Command) error {
	if err := logsapi.ValidateAndApply(o.logging, nil); err != nil {
		return err
	}
	if o.nodeName == "" {
		return fmt.Errorf("--node-name (or env NODE_NAME) is required")
	}
	if !slices.Contains(plugin.MIGModes, plugin.MIGMode(o.migMode)) {
		return fmt.Errorf("--mig-mode %q: must be one of %v", o.migMode, plugin.MIGModes)
	}
	if err := o.hw.validate(); err != nil {
		return err
	}
	if err := o.cdi.validate(); err != nil {
		return err
	}
	if err := o.sharing.validate(); err != nil {
		return err
	}
	if err := o.vfio.validate(); err != nil {
		return err
	}
	healthPolicy, err := o.health.policy()
	if err != nil {
		return err
	}
	if o.pluginDataDir == "" {
		o.pluginDataDir = filepath.Join(kubeletplugin.KubeletPluginsDir, o.driverName)
	}
	if sock := nodemode.DevicePluginListening(o.devicePlugins); sock != "" {
		return fmt.Errorf("a device plugin for NVIDIA GPUs serves this node (it listens on %s): a node runs the DRA plugin or a device plugin, never both, or its GPUs would be admitted twice. Move the node to one mode (docs/migration.md)", sock)
	}
	for _, dir := range []string{o.pluginDataDir, o.registrarDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
	}
	client, err := o.kubeClient()
	if err != nil {
		return err
	}
	hw, fleetMIGMode, err := o.hw.nodeHardware(o.nodeName)
	if err != nil {
		return err
	}
	if fleetMIGMode != "" && !cmd.Flags().Changed("mig-mode") {
		o.migMode = fleetMIGMode
	}
	ctx := cmd.Context()
	logger := klog.FromContext(ctx)
	fleetNode, err := o.hw.fleetNode(o.nodeName)
	if err != nil {
		return err
	}
	vfioConfig, err := o.vfio.config(&o.hw, fleetNode)
	if err != nil {
		return err
	}
	gpuSharing, err := o.gpuSharing.resolve(cmd.Flags(), fleetNode)
	if err != nil {
		return err
	}
	timeSlicer, err := o.sharing.timeSlicer(&o.hw)
	if err != nil {
		return err
	}
	mpsManager, mpsUnavailable := o.sharing.mpsManager(&o.hw)
	if timeSlicer == nil {
		logger.Info("Time-slicing is not available: nvidia-smi not found; claims asking for it are refused", "nvidiaSMIPath", o.sharing.nvidiaSMI)
	}
	if mpsManager == nil {
		logger.Info("MPS is not available; claims asking for it are refused", "reason", mpsUnavailable)
	}
	if !strings.HasPrefix(o.metricsPath, "/") {
		return fmt.Errorf("--metrics-path %q: must start with /", o.metricsPath)
	}
	var httpListener net.Listener
	if o.httpEndpoint != "" {
		// Listen before anything starts: a port in use fails at once.
		if httpListener, err = net.Listen("tcp", o.httpEndpoint); err != nil {
			return fmt.Errorf("--http-endpoint: %w", err)
		}
		defer httpListener.Close()
	}
	driver, err := plugin.Start(ctx, plugin.Config{
		VFIO:              vfioConfig,
		Sharing:           gpuSharing,
		TimeSlicer:        timeSlicer,
		MPS:               mpsManager,
		MPSUnavailable:    mpsUnavailable,
		DriverName:        o.driverName,
		NodeName:          o.nodeName,
		KubeClient:        client,
		Hardware:          hw,
		DriverEdits:       driverEdits(&o.hw, &o.cdi),
		PluginDataDir:     o.pluginDataDir,
		RegistrarDir:      o.registrarDir,
		CDIDir:            o.cdiDir,
		RollingUpdateUID:  types.UID(o.podUID),
		DiscoveryInterval: o.discoveryEvery,
		CallTimeout:       o.callTimeout,
		SweepInterval:     o.sweepEvery,
		MIGMode:           plugin.MIGMode(o.migMode),
		MIGModeSwitching:  o.migSwitching,
		HealthPolicy:      healthPolicy,
	})
	if err != nil {
		return err
	}
	httpDone := make(chan error, 1)
	if httpListener != nil {
		srv := metrics.NewServer(driver.Metrics(), o.metricsPath, driver.Ready)
		go func() { httpDone <- srv.Serve(ctx, httpListener) }()
		logger.Info("Serving metrics and probes", "address", httpListener.Addr().String(), "metricsPath", o.metricsPath)
	}
	select {
	case <-ctx.Done():
	case err := <-httpDone:
		// The plugin goes on serving the kubelet without it.
		logger.Error(err, "HTTP server of metrics and probes stopped")
		<-ctx.Done()
	}
	logger.Info("Shutting down")
	driver.Stop()
	return nil
}

func (o *kubeletPluginOptions) kubeClient() (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if o.kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("API client config: %w", err)
	}
	cfg.QPS = o.kubeAPIQPS
	cfg.Burst = o.kubeAPIBurst
	cfg.UserAgent = "gpudra-kubelet-plugin/" + version.Get().UserAgentVersion()
	return kubernetes.NewForConfig(cfg)
}
