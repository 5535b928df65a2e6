package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/deviceplugin"
	"github.com/gpudra/gpudra/pkg/health"
	"github.com/gpudra/gpudra/pkg/mps"
	"github.com/gpudra/gpudra/pkg/nodemode"
)

type devicePluginOptions struct {
	hw                  discoveryFlags
	cdi                 cdiFlags
	sharing             sharingFlags
	configFile          string
	migStrategy         string
	deviceListStrategy  []string
	deviceIDStrategy    string
	passDeviceSpecs     bool
	cdiAnnotationPrefix string
	devicePluginDir     string
	cdiDir              string
	driverName          string
	nodeName            string
	draPluginDir        string
	ignoreXIDs          string
	logging             *logsapi.LoggingConfiguration
}

func newDevicePluginCommand() *cobra.Command {
	o := &devicePluginOptions{logging: logsapi.NewLoggingConfiguration()}
	cmd := &cobra.Command{
		Use:   "device-plugin",
		Short: "Run the classic kubelet device plugin: nvidia.com/gpu and MIG resources, for nodes not on DRA yet",
		Long: `Serves the kubelet's device-plugin API v1beta1 from the same discovery and device model as the
DRA kubelet plugin: nvidia.com/gpu, MIG resources under NVIDIA's strategies (nvidia.com/mig-<profile>
with mixed), and time-slicing replicas from NVIDIA's device-plugin config file. A node runs this or
the DRA plugin, never both: each refuses to start while the other serves the node. See docs/migration.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	fs := cmd.Flags()
	o.hw.addFlags(fs)
	o.cdi.addFlags(fs)
	o.sharing.addFlags(fs)
	fs.StringVar(&o.configFile, "config-file", "", "NVIDIA's device-plugin config file (version v1: flags.migStrategy, flags.plugin.*, sharing.timeSlicing); flags given on the command line win")
	fs.StringVar(&o.migStrategy, "mig-strategy", deviceplugin.MIGStrategyNone, "how MIG devices are offered, one of none (every GPU as nvidia.com/gpu), single (MIG devices of one profile as nvidia.com/gpu), mixed (nvidia.com/mig-<profile>)")
	fs.StringSliceVar(&o.deviceListStrategy, "device-list-strategy", []string{deviceplugin.DeviceListCDICRI}, "how a container gets its devices, any of cdi-cri (CDI device names in the Allocate response), envvar (NVIDIA_VISIBLE_DEVICES for a legacy runtime hook), cdi-annotations")
	fs.StringVar(&o.deviceIDStrategy, "device-id-strategy", deviceplugin.DeviceIDUUID, "device IDs the kubelet sees and NVIDIA_VISIBLE_DEVICES carries, one of uuid, index")
	fs.BoolVar(&o.passDeviceSpecs, "pass-device-specs", false, "also list the device nodes in the Allocate response (runtimes without CDI and without NVIDIA's hook)")
	fs.StringVar(&o.cdiAnnotationPrefix, "cdi-annotation-prefix", "cdi.k8s.io/", "annotation prefix of the cdi-annotations strategy")
	fs.StringVar(&o.devicePluginDir, "device-plugin-dir", nodemode.DefaultDevicePluginDir, "the kubelet's device-plugin directory, with its kubelet.sock")
	fs.StringVar(&o.cdiDir, "cdi-dir", "/var/run/cdi", "directory for the node's CDI spec (k8s.<driver-name>/device); the container runtime must read it")
	fs.StringVar(&o.driverName, "driver-name", "gpu.nvidia.com", "driver name: the CDI vendor is k8s.<driver-name>, and a DRA plugin of this name must not serve the node")
	fs.StringVar(&o.nodeName, "node-name", os.Getenv("NODE_NAME"), "name of this node, for a simulated fleet's node (env NODE_NAME)")
	fs.StringVar(&o.draPluginDir, "dra-plugin-data-dir", "", "the DRA plugin's directory on this node (default /var/lib/kubelet/plugins/<driver-name>): the device plugin refuses to start while a DRA plugin listens there")
	fs.StringVar(&o.ignoreXIDs, "health-ignore-xids", health.FormatXIDs(health.DefaultPolicy().IgnoreXIDs), "XIDs that leave a GPU Healthy (application errors), comma-separated; other XIDs, double-bit ECC errors and a lost GPU make its devices Unhealthy until it recovers")
	logsapi.AddFlags(o.logging, fs)
	return cmd
}

func (o *devicePluginOptions) run(cmd *cobra.Command) error {
	if err := logsapi.ValidateAndApply(o.logging, nil); err != nil {
		return err
	}
	opts, err := o.options(cmd.Flags())
	if err != nil {
		return err
	}
	if o.draPluginDir == "" {
		o.draPluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, o.driverName)
	}
	if sock := nodemode.DRAPluginListening(o.draPluginDir); sock != "" {
		return fmt.Errorf("a DRA kubelet plugin of %s serves this node (it listens on %s): a node runs the DRA plugin or the device plugin, never both, or its GPUs would be admitted twice. Move the node to one mode (docs/migration.md)", o.driverName, sock)
	}
	if err := os.MkdirAll(o.devicePluginDir, 0o750); err != nil {
		return fmt.Errorf("--device-plugin-dir: %w", err)
	}
	ctx := cmd.Context()
	logger := klog.FromContext(ctx)
	p, err := deviceplugin.New(ctx, opts)
	if err != nil {
		return err
	}
	logger.Info("Serving the device plugin", "dir", o.devicePluginDir, "resources", len(p.Resources()))
	return p.Run(ctx)
}

// options merges the config file's flags under the command line's and
// checks every value, naming the flag or the config field.
func (o *devicePluginOptions) options(fs *pflag.FlagSet) (deviceplugin.Options, error) {
	var opts deviceplugin.Options
	cfg := &deviceplugin.Config{Version: "v1"}
	if o.configFile != "" {
		var err error
		if cfg, err = deviceplugin.LoadConfig(o.configFile); err != nil {
			return opts, fmt.Errorf("--config-file: %w", err)
		}
	}
	f, p := cfg.Flags, cfg.Flags.Plugin
	if f.MigStrategy != nil && !fs.Changed("mig-strategy") {
		o.migStrategy = *f.MigStrategy
	}
	if f.NvidiaDriverRoot != nil && !fs.Changed("driver-root") {
		o.hw.driverRoot = *f.NvidiaDriverRoot
	}
	if p != nil {
		if len(p.DeviceListStrategy) > 0 && !fs.Changed("device-list-strategy") {
			o.deviceListStrategy = p.DeviceListStrategy
		}
		if p.DeviceIDStrategy != nil && !fs.Changed("device-id-strategy") {
			o.deviceIDStrategy = *p.DeviceIDStrategy
		}
		if p.PassDeviceSpecs != nil && !fs.Changed("pass-device-specs") {
			o.passDeviceSpecs = *p.PassDeviceSpecs
		}
		if p.CDIAnnotationPrefix != nil && !fs.Changed("cdi-annotation-prefix") {
			o.cdiAnnotationPrefix = *p.CDIAnnotationPrefix
		}
		if p.ContainerDriverRoot != nil && !fs.Changed("container-driver-root") {
			o.hw.containerDriverRoot = *p.ContainerDriverRoot
		}
	}
	if !slices.Contains(deviceplugin.MIGStrategies, o.migStrategy) {
		return opts, fmt.Errorf("--mig-strategy %q: must be one of %s", o.migStrategy, strings.Join(deviceplugin.MIGStrategies, ", "))
	}
	for _, s := range o.deviceListStrategy {
		if !slices.Contains(deviceplugin.DeviceListStrategies, s) {
			return opts, fmt.Errorf("--device-list-strategy %q: must be any of %s", s, strings.Join(deviceplugin.DeviceListStrategies, ", "))
		}
	}
	if !slices.Contains(deviceplugin.DeviceIDStrategies, o.deviceIDStrategy) {
		return opts, fmt.Errorf("--device-id-strategy %q: must be one of %s", o.deviceIDStrategy, strings.Join(deviceplugin.DeviceIDStrategies, ", "))
	}
	if o.hw.simulated() && o.nodeName == "" {
		return opts, fmt.Errorf("--node-name (or env NODE_NAME) is required with --fleet")
	}
	if err := o.hw.validate(); err != nil {
		return opts, err
	}
	if err := o.cdi.validate(); err != nil {
		return opts, err
	}
	if err := o.sharing.validate(); err != nil {
		return opts, err
	}
	if err := absolutePaths([]pathFlag{{"device-plugin-dir", &o.devicePluginDir}, {"cdi-dir", &o.cdiDir}}); err != nil {
		return opts, err
	}
	policy := health.DefaultPolicy()
	xids, err := health.ParseXIDs("health-ignore-xids", o.ignoreXIDs)
	if err != nil {
		return opts, err
	}
	policy.IgnoreXIDs = append([]uint64{}, xids...)
	hw, _, err := o.hw.nodeHardware(o.nodeName)
	if err != nil {
		return opts, err
	}
	plan := deviceplugin.PlanOptions{MIGStrategy: o.migStrategy, DeviceIDStrategy: o.deviceIDStrategy, TimeSlicing: cfg.Sharing.TimeSlicing}
	var mpsManager *mps.Manager
	if cfg.Sharing.MPS != nil {
		plan.MPS = *cfg.Sharing.MPS
		var why string
		if mpsManager, why = o.sharing.mpsManager(&o.hw); mpsManager == nil {
			return opts, fmt.Errorf("--config-file: sharing.mps needs MPS daemons: %s", why)
		}
	}
	return deviceplugin.Options{
		MPS:                  mpsManager,
		Hardware:             hw,
		DriverName:           o.driverName,
		PluginDir:            o.devicePluginDir,
		CDIDir:               o.cdiDir,
		DriverEdits:          driverEdits(&o.hw, &o.cdi),
		Plan:                 plan,
		DeviceListStrategies: o.deviceListStrategy,
		CDIAnnotationPrefix:  o.cdiAnnotationPrefix,
		PassDeviceSpecs:      o.passDeviceSpecs,
		HealthPolicy:         policy,
	}, nil
}
