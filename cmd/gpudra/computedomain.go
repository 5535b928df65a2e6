package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpudra/gpudra/pkg/computedomain"
	"github.com/gpudra/gpudra/pkg/features"
	"github.com/gpudra/gpudra/pkg/features/imexchannel"
	"github.com/gpudra/gpudra/pkg/plugin"
	"github.com/gpudra/gpudra/pkg/pluginflags"
	"github.com/gpudra/gpudra/pkg/version"
)

// apiFlags are the API client flags every API-talking command has.
type apiFlags struct {
	kubeconfig string
	qps        float32
	burst      int
}

func (f *apiFlags) addFlags(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file; in-cluster config when empty (env KUBECONFIG)")
	fs.Float32Var(&f.qps, "kube-api-qps", pluginflags.DefaultKubeAPIQPS, "sustained requests per second to the API server")
	fs.IntVar(&f.burst, "kube-api-burst", pluginflags.DefaultKubeAPIBurst, "burst of requests to the API server")
}

// clients returns a typed and a dynamic client (ComputeDomains have no
// typed client).
func (f *apiFlags) clients(component string) (kubernetes.Interface, dynamic.Interface, *rest.Config, error) {
	var cfg *rest.Config
	var err error
	if f.kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", f.kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("API client config: %w", err)
	}
	cfg.QPS = f.qps
	cfg.Burst = f.burst
	cfg.UserAgent = "gpudra-" + component + "/" + version.Get().UserAgentVersion()
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, nil, nil, err
	}
	return kube, dyn, cfg, nil
}

type cdPluginOptions struct {
	hw             pluginflags.Discovery
	api            apiFlags
	driverName     string
	nodeName       string
	pluginDataDir  string
	registrarDir   string
	cdiDir         string
	podUID         string
	discoveryEvery time.Duration
	sweepEvery     time.Duration
	callTimeout    time.Duration
	maxChannels    int
	sharedChannel  bool
	httpEndpoint   string
	metricsPath    string
	imex           pluginflags.IMEXFlags
	logging        *logsapi.LoggingConfiguration
}

func newComputeDomainKubeletPluginCommand() *cobra.Command {
	o := &cdPluginOptions{logging: logsapi.NewLoggingConfiguration()}
	cmd := &cobra.Command{
		Use:   "compute-domain-kubelet-plugin",
		Short: "Run the node's ComputeDomain kubelet plugin: publish IMEX channel and daemon devices, prepare channel claims",
		Long: `Run the kubelet plugin of driver compute-domain.nvidia.com on a node of a
multi-node NVLink fabric. It is the same plugin shell as kubelet-plugin
(checkpoint, sweep, adoption, publishing) with the ComputeDomain features:
it publishes channel-0 and daemon-0, and prepares a channel claim by giving
its containers the channel its ComputeDomain holds (status.channel, which
compute-domain-controller assigns). See docs/computedomain.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd)
		},
	}
	fs := cmd.Flags()
	o.hw.AddFlags(fs)
	o.api.addFlags(cmd)
	fs.StringVar(&o.driverName, "driver-name", "compute-domain.nvidia.com", "DRA driver name; NVIDIA's DRA driver uses compute-domain.nvidia.com")
	fs.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "name of this node, also the pool name (env NODE_NAME)")
	fs.StringVar(&o.pluginDataDir, "plugin-data-dir", "", "directory for the DRA socket and the checkpoint (default /var/lib/kubelet/plugins/<driver-name>)")
	fs.StringVar(&o.registrarDir, "registrar-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registration directory")
	fs.StringVar(&o.cdiDir, "cdi-dir", "/var/run/cdi", "directory for the per-claim CDI specs; the container runtime must read it")
	fs.StringVar(&o.podUID, "pod-uid", os.Getenv("POD_UID"), "UID of the plugin's pod; enables rolling updates with two instances side by side (env POD_UID)")
	fs.DurationVar(&o.discoveryEvery, "discovery-interval", plugin.DefaultDiscoveryInterval, "how often the IMEX channels and NVLink clique are discovered again (sooner while discovery fails)")
	fs.DurationVar(&o.sweepEvery, "sweep-interval", plugin.DefaultSweepInterval, "how often stale prepared claims and orphaned CDI specs are cleaned up")
	fs.DurationVar(&o.callTimeout, "kubelet-call-timeout", plugin.DefaultCallTimeout, "the kubelet's timeout for one DRA call; older unfinished preparations are rolled back")
	fs.IntVar(&o.maxChannels, "max-channels", imexchannel.DefaultMaxChannels, "the node's IMEX channel count (the nvidia module's NVreg_ImexChannelCount): channels a domain may hold, and what allocation mode All opens")
	fs.BoolVar(&o.sharedChannel, "shared-channel", true, "publish channel-0 for several claims at once (allowMultipleAllocations), so that more than one ComputeDomain, and more than one pod of a domain, run on a node; false: one claim at a time, as NVIDIA's driver")
	fs.StringVar(&o.httpEndpoint, "http-endpoint", "", "TCP address of the HTTP server for metrics and probes (e.g. :8081); empty: no server")
	fs.StringVar(&o.metricsPath, "metrics-path", "/metrics", "HTTP path of the Prometheus metrics on --http-endpoint")
	o.imex.AddFlags(fs)
	logsapi.AddFlags(o.logging, fs)
	return cmd
}

func (o *cdPluginOptions) run(cmd *cobra.Command) error {
	if err := logsapi.ValidateAndApply(o.logging, nil); err != nil {
		return err
	}
	if o.nodeName == "" {
		return fmt.Errorf("--node-name (or env NODE_NAME) is required")
	}
	if o.maxChannels <= 0 {
		return fmt.Errorf("--max-channels %d: must be above zero", o.maxChannels)
	}
	if !strings.HasPrefix(o.metricsPath, "/") {
		return fmt.Errorf("--metrics-path %q: must start with /", o.metricsPath)
	}
	if err := o.hw.Validate(); err != nil {
		return err
	}
	if err := o.imex.Validate(); err != nil {
		return err
	}
	if o.pluginDataDir == "" {
		o.pluginDataDir = filepath.Join(kubeletplugin.KubeletPluginsDir, o.driverName)
	}
	for _, dir := range []string{o.pluginDataDir, o.registrarDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
	}
	kube, dyn, _, err := o.api.clients("compute-domain-kubelet-plugin")
	if err != nil {
		return err
	}
	hw, _, err := o.hw.NodeHardware(o.nodeName)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	imexd, err := o.imex.NodeDaemon(ctx, kube, dyn, o.nodeName, o.pluginDataDir)
	if err != nil {
		return err
	}
	var daemon imexchannel.Daemon
	if imexd != nil {
		daemon = imexd
		go func() { _ = imexd.Run(ctx) }()
	}
	httpListener, err := listenHTTP(o.httpEndpoint)
	if err != nil {
		return err
	}
	if httpListener != nil {
		defer httpListener.Close()
	}
	return servePlugin(ctx, plugin.Config{
		DriverName:        o.driverName,
		NodeName:          o.nodeName,
		KubeClient:        kube,
		Hardware:          hw,
		PluginDataDir:     o.pluginDataDir,
		RegistrarDir:      o.registrarDir,
		CDIDir:            o.cdiDir,
		RollingUpdateUID:  types.UID(o.podUID),
		DiscoveryInterval: o.discoveryEvery,
		CallTimeout:       o.callTimeout,
		SweepInterval:     o.sweepEvery,
		Features:          o.features(dyn, daemon),
	}, httpListener, o.metricsPath)
}

// features is the channel driver's feature set, for plugin.Config.
func (o *cdPluginOptions) features(dyn dynamic.Interface, daemon imexchannel.Daemon) func(plugin.FeatureEnv) (*features.Set, error) {
	return func(plugin.FeatureEnv) (*features.Set, error) {
		return features.NewComputeDomain(features.ComputeDomainOptions{
			Channels:      &computedomain.APIChannels{Client: dyn},
			MaxChannels:   o.maxChannels,
			SharedChannel: o.sharedChannel,
			Daemon:        daemon,
		}), nil
	}
}
