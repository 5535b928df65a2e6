package pluginflags

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/util/validation/field"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/deviceplugin"
	"github.com/gpudra/gpudra/pkg/health"
	"github.com/gpudra/gpudra/pkg/nodemode"
)

// DevicePlugin is the flags of `gpudra device-plugin`.
type DevicePlugin struct {
	HW                  Discovery
	CDI                 CDI
	Sharing             Sharing
	ConfigFile          string
	MIGStrategy         string
	DeviceListStrategy  []string
	DeviceIDStrategy    string
	PassDeviceSpecs     bool
	CDIAnnotationPrefix string
	DevicePluginDir     string
	CDIDir              string
	DriverName          string
	NodeName            string
	DRAPluginDir        string
	IgnoreXIDs          string
	Logging             *logsapi.LoggingConfiguration
}

// NewDevicePlugin returns the flags' holder with its logging
// configuration.
func NewDevicePlugin() *DevicePlugin {
	return &DevicePlugin{Logging: logsapi.NewLoggingConfiguration()}
}

// AddFlags adds every flag of `gpudra device-plugin` to fs.
func (o *DevicePlugin) AddFlags(fs *pflag.FlagSet) {
	o.HW.AddFlags(fs)
	o.CDI.AddFlags(fs)
	o.Sharing.AddFlags(fs)
	fs.StringVar(&o.ConfigFile, "config-file", "", "NVIDIA's device-plugin config file (version v1: flags.migStrategy, flags.plugin.*, sharing.timeSlicing); flags given on the command line win")
	fs.StringVar(&o.MIGStrategy, "mig-strategy", deviceplugin.MIGStrategyNone, "how MIG devices are offered, one of none (every GPU as nvidia.com/gpu), single (MIG devices of one profile as nvidia.com/gpu), mixed (nvidia.com/mig-<profile>)")
	fs.StringSliceVar(&o.DeviceListStrategy, "device-list-strategy", []string{deviceplugin.DeviceListCDICRI}, "how a container gets its devices, any of cdi-cri (CDI device names in the Allocate response), envvar (NVIDIA_VISIBLE_DEVICES for a legacy runtime hook), cdi-annotations")
	fs.StringVar(&o.DeviceIDStrategy, "device-id-strategy", deviceplugin.DeviceIDUUID, "device IDs the kubelet sees and NVIDIA_VISIBLE_DEVICES carries, one of uuid, index")
	fs.BoolVar(&o.PassDeviceSpecs, "pass-device-specs", false, "also list the device nodes in the Allocate response (runtimes without CDI and without NVIDIA's hook)")
	fs.StringVar(&o.CDIAnnotationPrefix, "cdi-annotation-prefix", "cdi.k8s.io/", "annotation prefix of the cdi-annotations strategy")
	fs.StringVar(&o.DevicePluginDir, "device-plugin-dir", nodemode.DefaultDevicePluginDir, "the kubelet's device-plugin directory, with its kubelet.sock")
	fs.StringVar(&o.CDIDir, "cdi-dir", "/var/run/cdi", "directory for the node's CDI spec (k8s.<driver-name>/device); the container runtime must read it")
	fs.StringVar(&o.DriverName, "driver-name", v1beta1.GPUDriverName, "driver name: the CDI vendor is k8s.<driver-name>, and a DRA plugin of this name must not serve the node")
	fs.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "name of this node, for a simulated fleet's node (env NODE_NAME)")
	fs.StringVar(&o.DRAPluginDir, "dra-plugin-data-dir", "", "the DRA plugin's directory on this node (default /var/lib/kubelet/plugins/<driver-name>): the device plugin refuses to start while a DRA plugin listens there")
	fs.StringVar(&o.IgnoreXIDs, "health-ignore-xids", health.FormatXIDs(health.DefaultPolicy().IgnoreXIDs), "XIDs that leave a GPU Healthy (application errors), comma-separated; other XIDs, double-bit ECC errors and a lost GPU make its devices Unhealthy until it recovers")
	logsapi.AddFlags(o.Logging, fs)
}

// ParseDevicePlugin parses args (the flags after `gpudra device-plugin`)
// with the command's flag set, as the binary does.
func ParseDevicePlugin(args []string) (*DevicePlugin, *pflag.FlagSet, error) {
	o := NewDevicePlugin()
	fs := pflag.NewFlagSet("device-plugin", pflag.ContinueOnError)
	fs.SetOutput(&strings.Builder{})
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, nil, fmt.Errorf("device-plugin %s: %w", strings.Join(args, " "), err)
	}
	if fs.NArg() > 0 {
		return nil, nil, fmt.Errorf("device-plugin: unexpected arguments %q", fs.Args())
	}
	return o, fs, nil
}

// Validate checks the flags, once the config file's values are merged
// under them, naming the flag; it fills in --dra-plugin-data-dir and
// --container-driver-root.
func (o *DevicePlugin) Validate() error {
	if !slices.Contains(deviceplugin.MIGStrategies, o.MIGStrategy) {
		return fmt.Errorf("--mig-strategy %q: must be one of %s", o.MIGStrategy, strings.Join(deviceplugin.MIGStrategies, ", "))
	}
	for _, s := range o.DeviceListStrategy {
		if !slices.Contains(deviceplugin.DeviceListStrategies, s) {
			return fmt.Errorf("--device-list-strategy %q: must be any of %s", s, strings.Join(deviceplugin.DeviceListStrategies, ", "))
		}
	}
	if !slices.Contains(deviceplugin.DeviceIDStrategies, o.DeviceIDStrategy) {
		return fmt.Errorf("--device-id-strategy %q: must be one of %s", o.DeviceIDStrategy, strings.Join(deviceplugin.DeviceIDStrategies, ", "))
	}
	if o.HW.Simulated() && o.NodeName == "" {
		return fmt.Errorf("--node-name (or env NODE_NAME) is required with --fleet")
	}
	for _, v := range []interface{ Validate() error }{&o.HW, &o.CDI, &o.Sharing} {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	if err := ValidateDriverName("driver-name", o.DriverName); err != nil {
		return err
	}
	if _, err := health.ParseXIDs("health-ignore-xids", o.IgnoreXIDs); err != nil {
		return err
	}
	if o.DRAPluginDir == "" {
		o.DRAPluginDir = filepath.Join(kubeletplugin.KubeletPluginsDir, o.DriverName)
	}
	return AbsolutePaths([]PathFlag{{Name: "device-plugin-dir", Value: &o.DevicePluginDir}, {Name: "cdi-dir", Value: &o.CDIDir}})
}

// Check runs every check of the flags that needs no I/O, as `gpudra
// device-plugin` does before it reads its config file and touches the
// node. The Helm chart's values schema is tested against it.
func (o *DevicePlugin) Check() error {
	if errs := logsapi.Validate(o.Logging, nil, field.NewPath("logging")); len(errs) > 0 {
		return errs.ToAggregate()
	}
	return o.Validate()
}

// CheckDevicePlugin parses args (the flags after `gpudra device-plugin`)
// and checks them with [DevicePlugin.Check].
func CheckDevicePlugin(args []string) error {
	o, _, err := ParseDevicePlugin(args)
	if err != nil {
		return err
	}
	return o.Check()
}
