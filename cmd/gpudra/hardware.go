package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/nvmlhw"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
)

// discoveryFlags choose between real NVML and a simulated fleet, and say
// where NVML discovery finds the driver, sysfs and procfs. Every command
// that discovers GPUs has them.
type discoveryFlags struct {
	fleet               string
	driverRoot          string
	containerDriverRoot string
	sysfsRoot           string
	procRoot            string
	simStateDir         string
}

func (f *discoveryFlags) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.fleet, "fleet", "", fmt.Sprintf("simulate the GPUs of a fleet file (YAML) or built-in fleet (%v) instead of using NVML", sim.BuiltinNames()))
	fs.StringVar(&f.driverRoot, "driver-root", "/", "the NVIDIA driver's root on the host, as CDI specs name it: / for a host-installed driver, /run/nvidia/driver with the GPU operator's driver container")
	fs.StringVar(&f.containerDriverRoot, "container-driver-root", "", "where this process sees --driver-root, e.g. where a DaemonSet mounts it; libnvidia-ml.so.1 and the driver's files are looked up here (default: --driver-root)")
	fs.StringVar(&f.sysfsRoot, "sysfs-root", "/sys", "sysfs mount, for PCIe roots and NUMA nodes")
	fs.StringVar(&f.procRoot, "proc-root", "/proc", "procfs mount, for device majors and MIG capability minors")
	fs.StringVar(&f.simStateDir, "sim-state-dir", "", "with --fleet: keep the simulated node's MIG devices, MIG modes, VFIO bindings and time slices in files in this directory, so that they outlive the process as a real node's do (default: in memory, forgotten at exit)")
}

// validate checks the roots and fills in --container-driver-root.
func (f *discoveryFlags) validate() error {
	if f.containerDriverRoot == "" {
		f.containerDriverRoot = f.driverRoot
	}
	paths := []pathFlag{
		{"driver-root", &f.driverRoot},
		{"container-driver-root", &f.containerDriverRoot},
		{"sysfs-root", &f.sysfsRoot},
		{"proc-root", &f.procRoot},
	}
	if f.simStateDir != "" {
		if !f.simulated() {
			return fmt.Errorf("--sim-state-dir %q: only with --fleet", f.simStateDir)
		}
		paths = append(paths, pathFlag{"sim-state-dir", &f.simStateDir})
	}
	if err := absolutePaths(paths); err != nil {
		return err
	}
	if f.simStateDir != "" {
		if err := os.MkdirAll(f.simStateDir, 0o750); err != nil {
			return fmt.Errorf("--sim-state-dir: %w", err)
		}
	}
	return nil
}

// simStateFile returns the path of one of the simulated node's state
// files, "" when the state is kept in memory.
func (f *discoveryFlags) simStateFile(name string) string {
	if f.simStateDir == "" {
		return ""
	}
	return filepath.Join(f.simStateDir, name)
}

// simulated reports whether a fleet replaces NVML.
func (f *discoveryFlags) simulated() bool { return f.fleet != "" }

// nodeHardware returns the hardware of one node: the fleet's node when a
// fleet is given, NVML otherwise. NVML is loaded from the driver root as
// this process sees it. migMode is the fleet node's MIG mode ("" when the
// fleet leaves it to the flag, and for NVML).
func (f *discoveryFlags) nodeHardware(node string) (hw hardware.Hardware, migMode string, err error) {
	if !f.simulated() {
		return nvmlhw.NewReal(nvmlhw.WithDriverRoot(f.containerDriverRoot), nvmlhw.WithSysfsRoot(f.sysfsRoot), nvmlhw.WithProcRoot(f.procRoot)), "", nil
	}
	fleet, err := sim.Load(f.fleet)
	if err != nil {
		return nil, "", err
	}
	n, err := fleet.Node(node)
	if err != nil {
		return nil, "", err
	}
	var opts []sim.HardwareOption
	if path := f.simStateFile(sim.NVMLStateFile); path != "" {
		opts = append(opts, sim.WithStateFile(path))
	}
	return n.Hardware(opts...), n.MIGMode, nil
}

// fleetNode returns the simulated node, or nil when NVML is used.
func (f *discoveryFlags) fleetNode(node string) (*sim.Node, error) {
	if !f.simulated() {
		return nil, nil
	}
	fleet, err := sim.Load(f.fleet)
	if err != nil {
		return nil, err
	}
	return fleet.Node(node)
}

// cdiFlags say what the CDI specs of the driver's files need besides the
// driver roots. Only the kubelet plugin writes CDI specs.
type cdiFlags struct {
	devRoot  string
	hookPath string
}

func (f *cdiFlags) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.devRoot, "dev-root", "", "where this process sees the driver's device nodes (default: --container-driver-root); nodes under --container-driver-root are named under --driver-root in CDI specs")
	fs.StringVar(&f.hookPath, "nvidia-cdi-hook-path", cdi.DefaultNVIDIACDIHookPath, "path of nvidia-cdi-hook on the host, written into CDI specs as it is")
}

func (f *cdiFlags) validate() error {
	paths := []pathFlag{{"nvidia-cdi-hook-path", &f.hookPath}}
	if f.devRoot != "" {
		paths = append(paths, pathFlag{"dev-root", &f.devRoot})
	}
	return absolutePaths(paths)
}

// driverEdits returns where CDI specs get the driver's files from.
func driverEdits(hw *discoveryFlags, c *cdiFlags) cdi.DriverEdits {
	if hw.simulated() {
		return cdi.NoDriverEdits{}
	}
	return cdi.NewNVCDIEdits(cdi.NVCDIOptions{
		DriverRoot:          hw.driverRoot,
		ContainerDriverRoot: hw.containerDriverRoot,
		DevRoot:             c.devRoot,
		HookPath:            c.hookPath,
	})
}

// absolutePaths requires every flag's path to be absolute and cleans it:
// a relative root would depend on the working directory, and the
// translation between the host's and this process's view compares cleaned
// paths.
func absolutePaths(paths []pathFlag) error {
	for _, f := range paths {
		if !filepath.IsAbs(*f.value) {
			return fmt.Errorf("--%s %q: must be an absolute path", f.name, *f.value)
		}
		*f.value = filepath.Clean(*f.value)
	}
	return nil
}

// pathFlag is a flag's name and the path it holds.
type pathFlag struct {
	name  string
	value *string
}

func hostname() string {
	if n := os.Getenv("NODE_NAME"); n != "" {
		return n
	}
	n, err := os.Hostname()
	if err != nil {
		return "localhost"
	}
	return n
}
