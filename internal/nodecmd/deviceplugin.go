package nodecmd

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/deviceplugin"
	"github.com/gpudra/gpudra/pkg/health"
	"github.com/gpudra/gpudra/pkg/mps"
	"github.com/gpudra/gpudra/pkg/nodemode"
	"github.com/gpudra/gpudra/pkg/pluginflags"
)

// NewDevicePluginCommand serves the kubelet's device-plugin API, the
// alternative to the DRA kubelet plugin on nodes not on DRA yet.
func NewDevicePluginCommand() *cobra.Command {
	o := pluginflags.NewDevicePlugin()
	cmd := &cobra.Command{
		Use:   "device-plugin",
		Short: "Run the classic kubelet device plugin: nvidia.com/gpu and MIG resources, for nodes not on DRA yet",
		Long: `Serves the kubelet's device-plugin API v1beta1 from the same discovery and device model as the
DRA kubelet plugin: nvidia.com/gpu, MIG resources under NVIDIA's strategies (nvidia.com/mig-<profile>
with mixed), and time-slicing replicas from NVIDIA's device-plugin config file. A node runs this or
the DRA plugin, never both: each refuses to start while the other serves the node. See docs/guides/migration.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runDevicePlugin(cmd, o) },
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func runDevicePlugin(cmd *cobra.Command, o *pluginflags.DevicePlugin) error {
	if err := logsapi.ValidateAndApply(o.Logging, nil); err != nil {
		return err
	}
	opts, err := devicePluginOptions(o, cmd.Flags())
	if err != nil {
		return err
	}
	if sock := nodemode.DRAPluginListening(o.DRAPluginDir); sock != "" {
		return fmt.Errorf("a DRA kubelet plugin of %s serves this node (it listens on %s): a node runs the DRA plugin or the device plugin, never both, or its GPUs would be admitted twice. Move the node to one mode (label %s, docs/guides/migration.md)", o.DriverName, sock, nodemode.Label)
	}
	if err := os.MkdirAll(o.DevicePluginDir, 0o750); err != nil {
		return fmt.Errorf("--device-plugin-dir: %w", err)
	}
	ctx := cmd.Context()
	logger := klog.FromContext(ctx)
	p, err := deviceplugin.New(ctx, opts)
	if err != nil {
		return err
	}
	logger.Info("Serving the device plugin", "dir", o.DevicePluginDir, "resources", len(p.Resources()))
	return p.Run(ctx)
}

// devicePluginOptions merges the config file's flags under the command
// line's and checks every value, naming the flag or the config field.
func devicePluginOptions(o *pluginflags.DevicePlugin, fs *pflag.FlagSet) (deviceplugin.Options, error) {
	var opts deviceplugin.Options
	cfg := &deviceplugin.Config{Version: "v1"}
	if o.ConfigFile != "" {
		var err error
		if cfg, err = deviceplugin.LoadConfig(o.ConfigFile); err != nil {
			return opts, fmt.Errorf("--config-file: %w", err)
		}
	}
	f, p := cfg.Flags, cfg.Flags.Plugin
	if f.MigStrategy != nil && !fs.Changed("mig-strategy") {
		o.MIGStrategy = *f.MigStrategy
	}
	if f.NvidiaDriverRoot != nil && !fs.Changed("driver-root") {
		o.HW.DriverRoot = *f.NvidiaDriverRoot
	}
	if p != nil {
		if len(p.DeviceListStrategy) > 0 && !fs.Changed("device-list-strategy") {
			o.DeviceListStrategy = p.DeviceListStrategy
		}
		if p.DeviceIDStrategy != nil && !fs.Changed("device-id-strategy") {
			o.DeviceIDStrategy = *p.DeviceIDStrategy
		}
		if p.PassDeviceSpecs != nil && !fs.Changed("pass-device-specs") {
			o.PassDeviceSpecs = *p.PassDeviceSpecs
		}
		if p.CDIAnnotationPrefix != nil && !fs.Changed("cdi-annotation-prefix") {
			o.CDIAnnotationPrefix = *p.CDIAnnotationPrefix
		}
		if p.ContainerDriverRoot != nil && !fs.Changed("container-driver-root") {
			o.HW.ContainerDriverRoot = *p.ContainerDriverRoot
		}
	}
	if err := o.Validate(); err != nil {
		return opts, err
	}
	policy := health.DefaultPolicy()
	xids, err := health.ParseXIDs("health-ignore-xids", o.IgnoreXIDs)
	if err != nil {
		return opts, err
	}
	policy.IgnoreXIDs = append([]uint64{}, xids...)
	hw, _, err := o.HW.NodeHardware(o.NodeName)
	if err != nil {
		return opts, err
	}
	plan := deviceplugin.PlanOptions{MIGStrategy: o.MIGStrategy, DeviceIDStrategy: o.DeviceIDStrategy, TimeSlicing: cfg.Sharing.TimeSlicing}
	var mpsManager *mps.Manager
	if cfg.Sharing.MPS != nil {
		plan.MPS = *cfg.Sharing.MPS
		var why string
		if mpsManager, why = o.Sharing.MPSManager(&o.HW); mpsManager == nil {
			return opts, fmt.Errorf("--config-file: sharing.mps needs MPS daemons: %s", why)
		}
	}
	return deviceplugin.Options{
		MPS:                  mpsManager,
		Hardware:             hw,
		DriverName:           o.DriverName,
		PluginDir:            o.DevicePluginDir,
		CDIDir:               o.CDIDir,
		DriverEdits:          pluginflags.DriverEdits(&o.HW, &o.CDI),
		Plan:                 plan,
		DeviceListStrategies: o.DeviceListStrategy,
		CDIAnnotationPrefix:  o.CDIAnnotationPrefix,
		PassDeviceSpecs:      o.PassDeviceSpecs,
		HealthPolicy:         policy,
	}, nil
}
