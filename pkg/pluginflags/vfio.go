package pluginflags

import (
	"fmt"
	"slices"

	"github.com/spf13/pflag"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
	"github.com/gpudra/gpudra/pkg/vfio"
)

// Values of --vfio.
const (
	vfioBeside = string(devicemodel.VFIOBeside)
	vfioOnly   = string(devicemodel.VFIOOnly)
	vfioOff    = "off"
)

// VFIO flags configure VFIO passthrough.
type VFIO struct {
	mode   string
	gpus   []int
	driver string
}

// AddFlags adds the flags to fs.
func (f *VFIO) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.mode, "vfio", vfioBeside, fmt.Sprintf("VFIO passthrough of GPUs with an IOMMU group, one of [%s %s %s]: %s publishes gpu-vfio-<minor> devices beside the CUDA devices, kept apart by shared counters (needs partitionable devices; without them no VFIO device is published); %s offers the GPUs of --vfio-gpus for passthrough alone, without their CUDA devices; %s publishes none", vfioBeside, vfioOnly, vfioOff, vfioBeside, vfioOnly, vfioOff))
	fs.IntSliceVar(&f.gpus, "vfio-gpus", nil, "minors of the GPUs offered for passthrough (default: every GPU with an IOMMU group)")
	fs.StringVar(&f.driver, "vfio-driver", "", fmt.Sprintf("the VFIO driver GPUs are bound to, one of [%s %s] (the latter on Grace Hopper and Grace Blackwell); default: %s when a GPU's PCI device ID is one %s claims (GH200, GB200), else %s", vfio.VFIOPCI, vfio.NVGraceGPUVFIOPCI, vfio.NVGraceGPUVFIOPCI, vfio.NVGraceGPUVFIOPCI, vfio.VFIOPCI))
}

// Validate checks the flags and cleans their paths.
func (f *VFIO) Validate() error {
	if !slices.Contains([]string{vfioBeside, vfioOnly, vfioOff}, f.mode) {
		return fmt.Errorf("--vfio %q: must be one of [%s %s %s]", f.mode, vfioBeside, vfioOnly, vfioOff)
	}
	if f.driver != "" && !vfio.IsVFIODriver(f.driver) {
		return fmt.Errorf("--vfio-driver %q: must be one of [%s %s]", f.driver, vfio.VFIOPCI, vfio.NVGraceGPUVFIOPCI)
	}
	for i, minor := range f.gpus {
		if minor < 0 {
			return fmt.Errorf("--vfio-gpus %v: %d is no GPU minor (0 or more)", f.gpus, minor)
		}
		if slices.Contains(f.gpus[:i], minor) {
			return fmt.Errorf("--vfio-gpus %v: GPU minor %d is named twice", f.gpus, minor)
		}
	}
	return nil
}

// Config returns the plugin's VFIO config: real sysfs, procfs and modprobe,
// or for a simulated fleet's node a fake sysfs that models the kernel.
// With --vfio=off its mode is empty: no GPU is offered for passthrough,
// but sysfs is still read to name the GPUs the node's set-up bound to a
// VFIO driver, and to give back those of earlier claims.
func (f *VFIO) Config(hw *Discovery, fleetNode *simfleet.Node) (*draplugin.VFIOConfig, error) {
	mode := devicemodel.VFIOMode(f.mode)
	if f.mode == vfioOff {
		mode = ""
	}
	c := &draplugin.VFIOConfig{Mode: mode, GPUDriver: f.driver, GPUs: f.gpus}
	if fleetNode != nil {
		fake, err := fleetNode.SysfsWithState(hw.SimStateFile(sim.SysfsStateFile))
		if err != nil {
			return nil, err
		}
		c.FS, c.Busy, c.Modules = fake, fake, fake
		return c, nil
	}
	c.FS, c.Busy, c.Modules = vfio.Dir(hw.SysfsRoot), vfio.ProcHolders{Root: hw.ProcRoot}, vfio.Modprobe{}
	return c, nil
}
