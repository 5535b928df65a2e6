package pluginflags

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpudra/gpudra/pkg/computedomain"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/features"
	"github.com/gpudra/gpudra/pkg/features/imexchannel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/kubeclient"
)

// ComputeDomainPlugin is the flags of `gpudra compute-domain-kubelet-plugin`.
// The binary parses its command line with them, and the local cluster
// parses the Helm chart's compute-domains container arguments with the
// same flag set.
type ComputeDomainPlugin struct {
	HW         Discovery
	DriverName string
	NodeName   string
	kubeclient.Flags
	PluginDataDir     string
	RegistrarDir      string
	CDIDir            string
	PodUID            string
	DiscoveryInterval time.Duration
	SweepInterval     time.Duration
	CallTimeout       time.Duration
	MaxChannels       int
	SharedChannel     bool
	DeviceMetadata    bool
	HTTPEndpoint      string
	MetricsPath       string
	// IMEX is the node's IMEX daemon side.
	IMEX    IMEXFlags
	Logging *logsapi.LoggingConfiguration
}

// NewComputeDomainPlugin returns the flags' holder with its logging
// configuration.
func NewComputeDomainPlugin() *ComputeDomainPlugin {
	return &ComputeDomainPlugin{Logging: logsapi.NewLoggingConfiguration()}
}

// ParseComputeDomainPlugin parses args (the flags after `gpudra
// compute-domain-kubelet-plugin`) with the command's flag set, as the
// binary does.
func ParseComputeDomainPlugin(args []string) (*ComputeDomainPlugin, error) {
	o := NewComputeDomainPlugin()
	fs := pflag.NewFlagSet("compute-domain-kubelet-plugin", pflag.ContinueOnError)
	fs.SetOutput(&strings.Builder{})
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("compute-domain-kubelet-plugin %s: %w", strings.Join(args, " "), err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("compute-domain-kubelet-plugin: unexpected arguments %q", fs.Args())
	}
	return o, nil
}

// AddFlags adds every flag of `gpudra compute-domain-kubelet-plugin` to fs.
func (o *ComputeDomainPlugin) AddFlags(fs *pflag.FlagSet) {
	o.HW.AddFlags(fs)
	fs.StringVar(&o.DriverName, "driver-name", computedomain.DriverName, "DRA driver name; NVIDIA's DRA driver uses compute-domain.nvidia.com")
	fs.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "name of this node, also the pool name (env NODE_NAME)")
	o.Flags.AddFlags(fs)
	fs.StringVar(&o.PluginDataDir, "plugin-data-dir", "", "directory for the DRA socket and the checkpoint (default /var/lib/kubelet/plugins/<driver-name>)")
	fs.StringVar(&o.RegistrarDir, "registrar-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registration directory")
	fs.StringVar(&o.CDIDir, "cdi-dir", "/var/run/cdi", "directory for the per-claim CDI specs; the container runtime must read it")
	fs.StringVar(&o.PodUID, "pod-uid", os.Getenv("POD_UID"), "UID of the plugin's pod; enables rolling updates with two instances side by side (env POD_UID)")
	fs.DurationVar(&o.DiscoveryInterval, "discovery-interval", draplugin.DefaultDiscoveryInterval, "how often the IMEX channels and NVLink clique are discovered again (sooner while discovery fails)")
	fs.DurationVar(&o.SweepInterval, "sweep-interval", draplugin.DefaultSweepInterval, "how often stale prepared claims and orphaned CDI specs are cleaned up")
	fs.DurationVar(&o.CallTimeout, "kubelet-call-timeout", draplugin.DefaultCallTimeout, "the kubelet's timeout for one DRA call; older unfinished preparations are rolled back")
	fs.IntVar(&o.MaxChannels, "max-channels", imexchannel.DefaultMaxChannels, "the node's IMEX channel count (the nvidia module's NVreg_ImexChannelCount): channels a domain may hold, and what allocation mode All opens")
	fs.BoolVar(&o.SharedChannel, "shared-channel", true, "publish channel-0 for several claims at once (allowMultipleAllocations), so that more than one ComputeDomain, and more than one pod of a domain, run on a node; false: one claim at a time, as NVIDIA's driver")
	fs.BoolVar(&o.DeviceMetadata, "device-metadata", true, "write a metadata file (KEP-5304) for every prepared channel, with its ComputeDomain and channel number, which the claim's containers read under /var/run/kubernetes.io/dra-device-attributes/. See docs/guides/device-metadata.md")
	fs.StringVar(&o.HTTPEndpoint, "http-endpoint", "", "TCP address of the HTTP server for metrics and probes (e.g. :8081); empty: no server")
	fs.StringVar(&o.MetricsPath, "metrics-path", "/metrics", "HTTP path of the Prometheus metrics on --http-endpoint")
	// Registered here, so that the chart's arguments for the IMEX daemon
	// parse with this same set.
	o.IMEX.AddFlags(fs)
	logsapi.AddFlags(o.Logging, fs)
}

// Validate checks the flags that need no I/O and fills in defaults that
// depend on other flags (--plugin-data-dir, --container-driver-root).
func (o *ComputeDomainPlugin) Validate() error {
	if o.NodeName == "" {
		return fmt.Errorf("--node-name (or env NODE_NAME) is required")
	}
	if o.MaxChannels <= 0 {
		return fmt.Errorf("--max-channels %d: must be above zero", o.MaxChannels)
	}
	if !strings.HasPrefix(o.MetricsPath, "/") {
		return fmt.Errorf("--metrics-path %q: must start with /", o.MetricsPath)
	}
	if err := o.HW.Validate(); err != nil {
		return err
	}
	if err := o.IMEX.Validate(); err != nil {
		return err
	}
	if o.PluginDataDir == "" {
		o.PluginDataDir = filepath.Join(kubeletplugin.KubeletPluginsDir, o.DriverName)
	}
	return nil
}

// Config validates the flags and returns the channel plugin's
// configuration: kube is its API client, dyn reads ComputeDomains (they
// have no typed client), hw, if not nil, is the node's hardware
// (otherwise NVML or the --fleet node), and daemon, if not nil, is the
// node's IMEX daemon that channel claims hold (see [IMEXFlags.NodeDaemon];
// nil serves channels only). It touches no directory.
func (o *ComputeDomainPlugin) Config(kube kubernetes.Interface, dyn dynamic.Interface, hw hardware.Hardware, daemon imexchannel.Daemon) (draplugin.Config, error) {
	if err := o.Validate(); err != nil {
		return draplugin.Config{}, err
	}
	if hw == nil {
		var err error
		if hw, _, err = o.HW.NodeHardware(o.NodeName); err != nil {
			return draplugin.Config{}, err
		}
	}
	channels := &computedomain.APIChannels{Client: dyn}
	maxChannels, shared := o.MaxChannels, o.SharedChannel
	return draplugin.Config{
		DriverName:        o.DriverName,
		NodeName:          o.NodeName,
		KubeClient:        kube,
		Hardware:          hw,
		PluginDataDir:     o.PluginDataDir,
		RegistrarDir:      o.RegistrarDir,
		CDIDir:            o.CDIDir,
		RollingUpdateUID:  types.UID(o.PodUID),
		DeviceMetadata:    o.DeviceMetadata,
		DiscoveryInterval: o.DiscoveryInterval,
		CallTimeout:       o.CallTimeout,
		SweepInterval:     o.SweepInterval,
		Features: func(draplugin.FeatureEnv) (*features.Set, error) {
			return features.NewComputeDomain(features.ComputeDomainOptions{
				Channels:      channels,
				MaxChannels:   maxChannels,
				SharedChannel: shared,
				Daemon:        daemon,
			}), nil
		},
	}, nil
}
