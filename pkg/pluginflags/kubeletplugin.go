package pluginflags

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/kubeclient"
	"github.com/gpudra/gpudra/pkg/mps"
	"github.com/gpudra/gpudra/pkg/nodemode"
	"github.com/gpudra/gpudra/pkg/timeslicing"
)

// KubeletPlugin is the flags of `gpudra kubelet-plugin`.
type KubeletPlugin struct {
	HW           Discovery
	CDI          CDI
	Sharing      Sharing
	VFIO         VFIO
	GPUSharing   GPUSharing
	Health       Health
	HTTPEndpoint string
	MetricsPath  string
	DriverName   string
	NodeName     string
	kubeclient.Flags
	PluginDataDir     string
	RegistrarDir      string
	DevicePluginDir   string
	CDIDir            string
	PodUID            string
	DiscoveryInterval time.Duration
	SweepInterval     time.Duration
	CallTimeout       time.Duration
	MIGMode           string
	MIGModeSwitching  bool
	DeviceMetadata    bool
	Logging           *logsapi.LoggingConfiguration
}

// NewKubeletPlugin returns the flags' holder with its logging
// configuration.
func NewKubeletPlugin() *KubeletPlugin {
	return &KubeletPlugin{Logging: logsapi.NewLoggingConfiguration()}
}

// ParseKubeletPlugin parses args (the flags after `gpudra kubelet-plugin`)
// with the command's flag set, as the binary does, and returns the flags
// and the set (which says what was given).
func ParseKubeletPlugin(args []string) (*KubeletPlugin, *pflag.FlagSet, error) {
	o := NewKubeletPlugin()
	fs := pflag.NewFlagSet("kubelet-plugin", pflag.ContinueOnError)
	fs.SetOutput(&strings.Builder{})
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, nil, fmt.Errorf("kubelet-plugin %s: %w", strings.Join(args, " "), err)
	}
	if fs.NArg() > 0 {
		return nil, nil, fmt.Errorf("kubelet-plugin: unexpected arguments %q", fs.Args())
	}
	return o, fs, nil
}

// AddFlags adds every flag of `gpudra kubelet-plugin` to fs.
func (o *KubeletPlugin) AddFlags(fs *pflag.FlagSet) {
	o.HW.AddFlags(fs)
	o.CDI.AddFlags(fs)
	o.Sharing.AddFlags(fs)
	o.VFIO.AddFlags(fs)
	o.Health.AddFlags(fs)
	o.GPUSharing.AddFlags(fs, "how full GPUs are shared between claims (KEP-5075 consumable capacity), one of none, memory-compute, shares=<N>, unlimited; a capped share gets an MPS daemon with its caps. See docs/guides/sharing.md")
	fs.StringVar(&o.DriverName, "driver-name", v1beta1.GPUDriverName, "DRA driver name; NVIDIA's DRA driver uses gpu.nvidia.com")
	fs.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "name of this node, also the pool name (env NODE_NAME)")
	o.Flags.AddFlags(fs)
	fs.StringVar(&o.PluginDataDir, "plugin-data-dir", "", "directory for the DRA socket and the checkpoint (default /var/lib/kubelet/plugins/<driver-name>)")
	fs.StringVar(&o.RegistrarDir, "registrar-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registration directory")
	fs.StringVar(&o.DevicePluginDir, "device-plugin-dir", nodemode.DefaultDevicePluginDir, "the kubelet's device-plugin directory: the DRA plugin refuses to start while a device plugin for NVIDIA GPUs (gpudra's or NVIDIA's) listens there")
	fs.StringVar(&o.CDIDir, "cdi-dir", "/var/run/cdi", "directory for the per-claim CDI specs; the container runtime must read it")
	fs.StringVar(&o.PodUID, "pod-uid", os.Getenv("POD_UID"), "UID of the plugin's pod; enables rolling updates with two instances side by side (env POD_UID)")
	fs.DurationVar(&o.DiscoveryInterval, "discovery-interval", draplugin.DefaultDiscoveryInterval, "how often GPUs are discovered again (sooner while discovery fails)")
	fs.DurationVar(&o.SweepInterval, "sweep-interval", draplugin.DefaultSweepInterval, "how often stale prepared claims and orphaned CDI specs are cleaned up; a claim the API server still has is asked about again after 1, 2, 4 ... up to 16 intervals (at once after a Prepare is refused because another claim holds its devices)")
	fs.DurationVar(&o.CallTimeout, "kubelet-call-timeout", draplugin.DefaultCallTimeout, "the kubelet's timeout for one DRA call; older unfinished preparations are rolled back")
	fs.StringVar(&o.MIGMode, "mig-mode", string(draplugin.MIGModeDynamic), fmt.Sprintf("how GPUs with MIG mode on are offered, one of %v: dynamic publishes every profile at every placement and creates the MIG device at Prepare; static publishes the MIG devices that exist and never creates or destroys one", draplugin.MIGModes))
	fs.StringVar(&o.HTTPEndpoint, "http-endpoint", "", "TCP address of the HTTP server for metrics and probes (e.g. :8080; /livez, /readyz and the metrics at --metrics-path); empty: no server")
	fs.StringVar(&o.MetricsPath, "metrics-path", "/metrics", "HTTP path of the Prometheus metrics on --http-endpoint")
	fs.BoolVar(&o.MIGModeSwitching, "mig-mode-switching", false, "with --mig-mode=dynamic, offer Hopper and newer MIG-capable GPUs both as a full GPU and as MIG devices whatever their MIG mode, and switch the mode at Prepare as the allocated device needs")
	fs.BoolVar(&o.DeviceMetadata, "device-metadata", true, "write a metadata file (KEP-5304) for every prepared device, with its attributes and what Prepare set up, which the claim's containers read under /var/run/kubernetes.io/dra-device-attributes/; the container runtime mounts it through CDI. See docs/guides/device-metadata.md")
	logsapi.AddFlags(o.Logging, fs)
}

// Validate checks the flags that need no I/O and fills in defaults that
// depend on other flags (--plugin-data-dir, --container-driver-root).
func (o *KubeletPlugin) Validate() error {
	if o.NodeName == "" {
		return fmt.Errorf("--node-name (or env NODE_NAME) is required")
	}
	if !slices.Contains(draplugin.MIGModes, draplugin.MIGMode(o.MIGMode)) {
		return fmt.Errorf("--mig-mode %q: must be one of %v", o.MIGMode, draplugin.MIGModes)
	}
	for _, v := range []interface{ Validate() error }{&o.HW, &o.CDI, &o.Sharing, &o.VFIO} {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	if _, err := o.Health.Policy(); err != nil {
		return err
	}
	if _, err := o.Health.ReportInterval(); err != nil {
		return err
	}
	if !strings.HasPrefix(o.MetricsPath, "/") {
		return fmt.Errorf("--metrics-path %q: must start with /", o.MetricsPath)
	}
	if err := ValidateDriverName("driver-name", o.DriverName); err != nil {
		return err
	}
	if err := ValidateHTTPEndpoint("http-endpoint", o.HTTPEndpoint); err != nil {
		return err
	}
	if err := o.Flags.Validate(); err != nil {
		return err
	}
	for _, d := range []struct {
		name  string
		value time.Duration
	}{{"discovery-interval", o.DiscoveryInterval}, {"sweep-interval", o.SweepInterval}, {"kubelet-call-timeout", o.CallTimeout}} {
		if d.value < 0 {
			return fmt.Errorf("--%s %v: must be 0 (the default) or more", d.name, d.value)
		}
	}
	if o.PluginDataDir == "" {
		o.PluginDataDir = filepath.Join(kubeletplugin.KubeletPluginsDir, o.DriverName)
	}
	return AbsolutePaths([]PathFlag{{"plugin-data-dir", &o.PluginDataDir}, {"registrar-dir", &o.RegistrarDir}, {"cdi-dir", &o.CDIDir}})
}

// Check runs every check of the flags that needs no I/O, as `gpudra
// kubelet-plugin` does before it touches the node: what it refuses, the
// plugin exits on at start. The Helm chart's values schema is tested
// against it.
func (o *KubeletPlugin) Check(fs *pflag.FlagSet) error {
	if errs := logsapi.Validate(o.Logging, nil, field.NewPath("logging")); len(errs) > 0 {
		return errs.ToAggregate()
	}
	if err := o.Validate(); err != nil {
		return err
	}
	return o.GPUSharing.Validate(fs)
}

// CheckKubeletPlugin parses args (the flags after `gpudra kubelet-plugin`)
// and checks them with [KubeletPlugin.Check].
func CheckKubeletPlugin(args []string) error {
	o, fs, err := ParseKubeletPlugin(args)
	if err != nil {
		return err
	}
	return o.Check(fs)
}

// Host is what a node gives its plugin besides the flags: the GPUs and
// the tools that reach them. A nil field comes from the flags (NVML under
// --container-driver-root, or the --fleet node; nvidia-smi and
// nvidia-cuda-mps-control under the driver root; sysfs for VFIO). The
// local cluster sets every field to its simulated node's.
type Host struct {
	// Hardware is the node's GPUs.
	Hardware hardware.Hardware
	// VFIO is the kernel side of passthrough (FS, Busy, Modules of a
	// draplugin.VFIOConfig); the mode, driver and GPUs still come from the
	// flags. Set with NoVFIO for a node without it.
	VFIO *draplugin.VFIOConfig
	// NoVFIO: the node offers no passthrough, whatever --vfio says.
	NoVFIO bool
	// TimeSlicer sets time slices.
	TimeSlicer timeslicing.Setter
	// MPS runs MPS daemons; with MPSUnavailable set instead, MPS claims
	// are refused with that reason.
	MPS            *mps.Manager
	MPSUnavailable string
	// DriverEdits say where CDI specs get the driver's files from.
	DriverEdits cdi.DriverEdits
}

// Config validates the flags and returns the plugin's configuration, with
// client as its API client and host's parts where host sets them. It
// touches no directory: the caller creates them and checks the node's
// device plugins (see `gpudra kubelet-plugin`).
func (o *KubeletPlugin) Config(fs *pflag.FlagSet, client kubernetes.Interface, host Host) (draplugin.Config, error) {
	if err := o.Validate(); err != nil {
		return draplugin.Config{}, err
	}
	healthPolicy, err := o.Health.Policy()
	if err != nil {
		return draplugin.Config{}, err
	}
	reportInterval, err := o.Health.ReportInterval()
	if err != nil {
		return draplugin.Config{}, err
	}
	cfg := draplugin.Config{
		HealthReportInterval: reportInterval,
		DriverName:           o.DriverName,
		NodeName:             o.NodeName,
		KubeClient:           client,
		PluginDataDir:        o.PluginDataDir,
		RegistrarDir:         o.RegistrarDir,
		CDIDir:               o.CDIDir,
		RollingUpdateUID:     types.UID(o.PodUID),
		DiscoveryInterval:    o.DiscoveryInterval,
		CallTimeout:          o.CallTimeout,
		SweepInterval:        o.SweepInterval,
		MIGMode:              draplugin.MIGMode(o.MIGMode),
		MIGModeSwitching:     o.MIGModeSwitching,
		DeviceMetadata:       o.DeviceMetadata,
		HealthPolicy:         healthPolicy,
		Hardware:             host.Hardware,
		TimeSlicer:           host.TimeSlicer,
		MPS:                  host.MPS,
		MPSUnavailable:       host.MPSUnavailable,
		DriverEdits:          host.DriverEdits,
	}
	if cfg.Hardware == nil {
		hw, fleetMIGMode, err := o.HW.NodeHardware(o.NodeName)
		if err != nil {
			return draplugin.Config{}, err
		}
		cfg.Hardware = hw
		if fleetMIGMode != "" && !fs.Changed("mig-mode") {
			cfg.MIGMode = draplugin.MIGMode(fleetMIGMode)
		}
	}
	fleetNode, err := o.HW.FleetNode(o.NodeName)
	if err != nil {
		return draplugin.Config{}, err
	}
	switch {
	case host.NoVFIO:
	case host.VFIO != nil:
		if cfg.VFIO, err = o.VFIO.Config(&o.HW, nil); err != nil {
			return draplugin.Config{}, err
		}
		if cfg.VFIO != nil {
			cfg.VFIO.FS, cfg.VFIO.Busy, cfg.VFIO.Modules = host.VFIO.FS, host.VFIO.Busy, host.VFIO.Modules
		}
	default:
		if cfg.VFIO, err = o.VFIO.Config(&o.HW, fleetNode); err != nil {
			return draplugin.Config{}, err
		}
	}
	if cfg.Sharing, err = o.GPUSharing.Resolve(fs, fleetNode); err != nil {
		return draplugin.Config{}, err
	}
	if cfg.TimeSlicer == nil {
		if cfg.TimeSlicer, err = o.Sharing.TimeSlicer(&o.HW); err != nil {
			return draplugin.Config{}, err
		}
	}
	if cfg.MPS == nil && cfg.MPSUnavailable == "" {
		cfg.MPS, cfg.MPSUnavailable = o.Sharing.MPSManager(&o.HW)
	}
	if cfg.DriverEdits == nil {
		cfg.DriverEdits = DriverEdits(&o.HW, &o.CDI)
	}
	return cfg, nil
}

// NVIDIASMIPath is the nvidia-smi time-slicing uses, for messages.
func (o *KubeletPlugin) NVIDIASMIPath() string { return o.Sharing.nvidiaSMI }
