package pluginflags

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/nvmlhw"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// Discovery flags choose between real NVML and a simulated fleet, and say
// where NVML discovery finds the driver, sysfs and procfs. Every command
// that discovers GPUs has them.
type Discovery struct {
	Fleet               string
	DriverRoot          string
	ContainerDriverRoot string
	SysfsRoot           string
	ProcRoot            string
	SimStateDir         string
}

// AddFlags adds the flags to fs.
func (f *Discovery) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.Fleet, "fleet", "", fmt.Sprintf("simulate the GPUs of a fleet file (YAML) or built-in fleet (%v) instead of using NVML", simfleet.BuiltinNames()))
	fs.StringVar(&f.DriverRoot, "driver-root", "/", "the NVIDIA driver's root on the host, as CDI specs name it: / for a host-installed driver, /run/nvidia/driver with the GPU operator's driver container")
	fs.StringVar(&f.ContainerDriverRoot, "container-driver-root", "", "where this process sees --driver-root, e.g. where a DaemonSet mounts it; libnvidia-ml.so.1 and the driver's files are looked up here (default: --driver-root)")
	fs.StringVar(&f.SysfsRoot, "sysfs-root", "/sys", "sysfs mount, for PCIe roots and NUMA nodes")
	fs.StringVar(&f.ProcRoot, "proc-root", "/proc", "procfs mount, for device majors and MIG capability minors")
	fs.StringVar(&f.SimStateDir, "sim-state-dir", "", "with --fleet: keep the simulated node's MIG devices, MIG modes, VFIO bindings and time slices in files in this directory, so that they outlive the process as a real node's do (default: in memory, forgotten at exit)")
}

// Validate checks the roots and fills in --container-driver-root.
func (f *Discovery) Validate() error {
	if f.ContainerDriverRoot == "" {
		f.ContainerDriverRoot = f.DriverRoot
	}
	paths := []PathFlag{
		{"driver-root", &f.DriverRoot},
		{"container-driver-root", &f.ContainerDriverRoot},
		{"sysfs-root", &f.SysfsRoot},
		{"proc-root", &f.ProcRoot},
	}
	if f.SimStateDir != "" {
		if !f.Simulated() {
			return fmt.Errorf("--sim-state-dir %q: only with --fleet", f.SimStateDir)
		}
		paths = append(paths, PathFlag{"sim-state-dir", &f.SimStateDir})
	}
	if err := AbsolutePaths(paths); err != nil {
		return err
	}
	if f.SimStateDir != "" {
		if err := os.MkdirAll(f.SimStateDir, 0o750); err != nil {
			return fmt.Errorf("--sim-state-dir: %w", err)
		}
	}
	return nil
}

// SimStateFile returns the path of one of the simulated node's state
// files, "" when the state is kept in memory.
func (f *Discovery) SimStateFile(name string) string {
	if f.SimStateDir == "" {
		return ""
	}
	return filepath.Join(f.SimStateDir, name)
}

// Simulated reports whether a fleet replaces NVML.
func (f *Discovery) Simulated() bool { return f.Fleet != "" }

// NodeHardware returns the hardware of one node: the fleet's node when a
// fleet is given, NVML otherwise. NVML is loaded from the driver root as
// this process sees it. migMode is the fleet node's MIG mode ("" when the
// fleet leaves it to the flag, and for NVML).
func (f *Discovery) NodeHardware(node string) (hw hardware.Hardware, migMode string, err error) {
	if !f.Simulated() {
		return nvmlhw.NewReal(nvmlhw.WithDriverRoot(f.ContainerDriverRoot), nvmlhw.WithSysfsRoot(f.SysfsRoot), nvmlhw.WithProcRoot(f.ProcRoot)), "", nil
	}
	fleet, err := simfleet.Load(f.Fleet)
	if err != nil {
		return nil, "", err
	}
	n, err := fleet.Node(node)
	if err != nil {
		return nil, "", err
	}
	var opts []sim.HardwareOption
	if path := f.SimStateFile(sim.NVMLStateFile); path != "" {
		opts = append(opts, sim.WithStateFile(path))
	}
	return n.Hardware(opts...), n.MIGMode, nil
}

// FleetNode returns the simulated node, or nil when NVML is used.
func (f *Discovery) FleetNode(node string) (*simfleet.Node, error) {
	if !f.Simulated() {
		return nil, nil
	}
	fleet, err := simfleet.Load(f.Fleet)
	if err != nil {
		return nil, err
	}
	return fleet.Node(node)
}

// CDI flags say what the CDI specs of the driver's files need besides the
// driver roots. Only the kubelet plugin writes CDI specs.
type CDI struct {
	devRoot  string
	hookPath string
}

// AddFlags adds the flags to fs.
func (f *CDI) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.devRoot, "dev-root", "", "where this process sees the driver's device nodes (default: --container-driver-root); nodes under --container-driver-root are named under --driver-root in CDI specs")
	fs.StringVar(&f.hookPath, "nvidia-cdi-hook-path", cdi.DefaultNVIDIACDIHookPath, "path of nvidia-cdi-hook on the host, written into CDI specs as it is")
}

// Validate checks the flags and cleans their paths.
func (f *CDI) Validate() error {
	paths := []PathFlag{{"nvidia-cdi-hook-path", &f.hookPath}}
	if f.devRoot != "" {
		paths = append(paths, PathFlag{"dev-root", &f.devRoot})
	}
	return AbsolutePaths(paths)
}

// DriverEdits returns where CDI specs get the driver's files from.
func DriverEdits(hw *Discovery, c *CDI) cdi.DriverEdits {
	if hw.Simulated() {
		return cdi.NoDriverEdits{}
	}
	return cdi.NewNVCDIEdits(cdi.NVCDIOptions{
		DriverRoot:          hw.DriverRoot,
		ContainerDriverRoot: hw.ContainerDriverRoot,
		DevRoot:             c.devRoot,
		HookPath:            c.hookPath,
	})
}

// AbsolutePaths requires every flag's path to be absolute and cleans it:
// a relative root would depend on the working directory, and the
// translation between the host's and this process's view compares cleaned
// paths.
func AbsolutePaths(paths []PathFlag) error {
	for _, f := range paths {
		if !filepath.IsAbs(*f.Value) {
			return fmt.Errorf("--%s %q: must be an absolute path", f.Name, *f.Value)
		}
		*f.Value = filepath.Clean(*f.Value)
	}
	return nil
}

// PathFlag is a flag's name and the path it holds.
type PathFlag struct {
	Name  string
	Value *string
}

// Hostname is the node name when none is given: env NODE_NAME, else the
// host name.
func Hostname() string {
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n
	}
	n, err := os.Hostname()
	if err != nil {
		return "localhost"
	}
	return n
}
