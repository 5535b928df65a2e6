package main

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"

	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/nvmlhw"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"k8s.io/klog/v2"
)

// hardwareFlags choose between real NVML and a simulated fleet.
type hardwareFlags struct {
	fleet      string
	driverRoot string
	devRoot    string
	sysfsRoot  string
	procRoot   string
	hookPath   string
}

func (f *hardwareFlags) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.fleet, "fleet", "", fmt.Sprintf("simulate the GPUs of a fleet file (YAML) or built-in fleet (%v) instead of using NVML", sim.BuiltinNames()))
	fs.StringVar(&f.driverRoot, "driver-root", "/", "root under which the NVIDIA driver's files (libnvidia-ml.so.1, binaries) are found; /run/nvidia/driver with the driver container")
	fs.StringVar(&f.devRoot, "dev-root", "", "root under which the device nodes are found (default: --driver-root)")
	fs.StringVar(&f.sysfsRoot, "sysfs-root", "/sys", "sysfs mount, for PCIe roots and NUMA nodes")
	fs.StringVar(&f.procRoot, "proc-root", "/proc", "procfs mount, for device majors and MIG capability minors")
	fs.StringVar(&f.hookPath, "nvidia-cdi-hook-path", "", "path of nvidia-cdi-hook on the host, used in CDI specs (default: found by the NVIDIA container toolkit library)")
}

// simulated reports whether a fleet replaces NVML.
func (f *hardwareFlags) simulated() bool { return f.fleet != "" }

// nodeHardware returns the hardware of one node: the fleet's node when a
// fleet is given, NVML otherwise.
func (f *hardwareFlags) nodeHardware(node string) (hardware.Hardware, error) {
	if !f.simulated() {
		return nvmlhw.NewReal(nvmlhw.WithDriverRoot(f.driverRoot), nvmlhw.WithSysfsRoot(f.sysfsRoot), nvmlhw.WithProcRoot(f.procRoot)), nil
	}
	fleet, err := sim.Load(f.fleet)
	if err != nil {
		return nil, err
	}
	n, err := fleet.Node(node)
	if err != nil {
		return nil, err
	}
	return n.Hardware(), nil
}

// driverEdits returns where CDI specs get the driver's files from.
func (f *hardwareFlags) driverEdits(logger klog.Logger) cdi.DriverEdits {
	if f.simulated() {
		return cdi.NoDriverEdits{}
	}
	return cdi.NewNVCDIEdits(logger, cdi.NVCDIOptions{DriverRoot: f.driverRoot, DevRoot: f.devRoot, HookPath: f.hookPath})
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
