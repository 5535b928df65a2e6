package fakesysfs

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/gpudra/gpudra/pkg/vfio"
)

// Function describes one PCI function of a fake.
type Function struct {
	// BusID is its PCI bus ID, "0000:1b:00.0".
	BusID string
	// Vendor and Device are four lower-case hex digits without "0x".
	Vendor, Device string
	// Class is six lower-case hex digits without "0x", "030200".
	Class string
	// IOMMUGroup is its IOMMU group.
	IOMMUGroup int
	// Driver is the driver it is bound to; "" for none. The driver must be
	// loaded and take the function.
	Driver string
	// DriverOverride is its driver_override; "" for none.
	DriverOverride string
	// SRIOVVFs, when set, makes it SR-IOV capable with this many virtual
	// functions enabled.
	SRIOVVFs *int
}

// Driver describes a PCI driver of a fake.
type Driver struct {
	// Name is its name in bus/pci/drivers, which is also its module's.
	Name string
	// VFIO marks a VFIO driver: binding a function to it creates VFIO
	// device nodes.
	VFIO bool
	// Loaded registers it from the start; otherwise its module must be
	// loaded (Sysfs.Load) before it can bind anything.
	Loaded bool
	// Matches is its ID table.
	Matches []Match
}

// Builder sets up a fake sysfs.
type Builder struct {
	root      string
	drivers   []Driver
	functions []Function
	iommufd   bool
	noIOMMU   bool
	stateFile string
}

// Device IDs the shorthands use.
const (
	// NVIDIAVendor is NVIDIA's PCI vendor ID.
	NVIDIAVendor = "10de"
	// H100SXMDevice is an H100 SXM5 80GB, a 3D controller without audio.
	H100SXMDevice = "2330"
	// RTX6000AdaDevice is an RTX 6000 Ada, a VGA controller whose HD audio
	// function shares its IOMMU group.
	RTX6000AdaDevice = "26b1"
	// RTX6000AdaAudioDevice is that GPU's audio function.
	RTX6000AdaAudioDevice = "22ba"
)

// NewBuilder returns a builder with the drivers of a GPU node: nvidia,
// snd_hda_intel and pcieport loaded, and the modules vfio-pci and
// nvgrace-gpu-vfio-pci available but not loaded. Sysfs is rooted at /sys,
// which only error messages show.
func NewBuilder() *Builder {
	return &Builder{
		root: vfio.DefaultSysfsRoot,
		drivers: []Driver{
			{Name: "nvidia", Loaded: true, Matches: []Match{{Vendor: NVIDIAVendor, ClassPrefix: "03"}}},
			{Name: "snd_hda_intel", Loaded: true, Matches: []Match{{ClassPrefix: "0403"}}},
			{Name: "pcieport", Loaded: true, Matches: []Match{{ClassPrefix: "0604"}}},
			{Name: vfio.VFIOPCI, VFIO: true},
			{Name: vfio.NVGraceGPUVFIOPCI, VFIO: true},
		},
	}
}

// Root sets the root shown in the paths of errors.
func (b *Builder) Root(root string) *Builder {
	b.root = strings.TrimSuffix(root, "/")
	return b
}

// Driver adds a driver, or replaces the one of the same name.
func (b *Builder) Driver(d Driver) *Builder {
	b.drivers = slices.DeleteFunc(b.drivers, func(o Driver) bool { return o.Name == d.Name })
	b.drivers = append(b.drivers, d)
	return b
}

// Function adds a PCI function.
func (b *Builder) Function(f Function) *Builder {
	b.functions = append(b.functions, f)
	return b
}

// GPU adds an H100 SXM bound to nvidia, alone in its IOMMU group.
func (b *Builder) GPU(busID string, group int) *Builder {
	return b.Function(Function{BusID: busID, Vendor: NVIDIAVendor, Device: H100SXMDevice, Class: "030200", IOMMUGroup: group, Driver: "nvidia"})
}

// GPUWithAudio adds an RTX 6000 Ada at busID, which must be function 0,
// bound to nvidia, and its HD audio function (function 1) bound to
// snd_hda_intel, both in group.
func (b *Builder) GPUWithAudio(busID string, group int) *Builder {
	audio := strings.TrimSuffix(busID, ".0") + ".1"
	b.Function(Function{BusID: busID, Vendor: NVIDIAVendor, Device: RTX6000AdaDevice, Class: "030000", IOMMUGroup: group, Driver: "nvidia"})
	return b.Function(Function{BusID: audio, Vendor: NVIDIAVendor, Device: RTX6000AdaAudioDevice, Class: "040300", IOMMUGroup: group, Driver: "snd_hda_intel"})
}

// IOMMUFD makes the kernel offer iommufd (/dev/iommu) and VFIO device
// nodes, as kernels 6.6 and newer built with VFIO_DEVICE_CDEV do. Without
// it VFIO devices still get their vfio-dev entry, but no dev attribute.
func (b *Builder) IOMMUFD() *Builder {
	b.iommufd = true
	return b
}

// NoIOMMU makes a machine whose IOMMU is off: no function has an IOMMU
// group, and VFIO drivers refuse to bind (EINVAL).
func (b *Builder) NoIOMMU() *Builder {
	b.noIOMMU = true
	return b
}

var hexDigits = regexp.MustCompile(`^[0-9a-f]+$`)

// Build returns the fake, or what is inconsistent about the setup.
func (b *Builder) Build() (*Sysfs, error) {
	s := &Sysfs{
		root:        b.root,
		devices:     make(map[string]*device),
		drivers:     make(map[string]*driver),
		modules:     make(map[string]*driver),
		iommufd:     b.iommufd,
		noIOMMU:     b.noIOMMU,
		groupMinors: make(map[int]int),
		devMinors:   make(map[int]bool),
		crashAfter:  -1,
		stateFile:   b.stateFile,
	}
	for _, d := range b.drivers {
		drv := &driver{name: d.Name, vfio: d.VFIO, matches: slices.Clone(d.Matches)}
		if d.Loaded {
			s.drivers[d.Name] = drv
		} else {
			s.modules[d.Name] = drv
		}
	}
	var errs []error
	for _, f := range b.functions {
		if err := s.addFunction(f); err != nil {
			errs = append(errs, fmt.Errorf("fake sysfs: function %q: %w", f.BusID, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if s.stateFile != "" {
		if err := s.loadState(); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *Sysfs) addFunction(f Function) error {
	switch {
	case !vfio.ValidBusID(f.BusID):
		return errors.New("not a PCI bus ID such as 0000:1b:00.0")
	case s.devices[f.BusID] != nil:
		return errors.New("added twice")
	case len(f.Vendor) != 4 || !hexDigits.MatchString(f.Vendor):
		return fmt.Errorf("vendor %q: want four lower-case hex digits", f.Vendor)
	case len(f.Device) != 4 || !hexDigits.MatchString(f.Device):
		return fmt.Errorf("device %q: want four lower-case hex digits", f.Device)
	case len(f.Class) != 6 || !hexDigits.MatchString(f.Class):
		return fmt.Errorf("class %q: want six lower-case hex digits", f.Class)
	case f.IOMMUGroup < 0:
		return fmt.Errorf("IOMMU group %d is negative", f.IOMMUGroup)
	}
	d := &device{
		busID: f.BusID, vendor: f.Vendor, deviceID: f.Device, class: f.Class,
		group: f.IOMMUGroup, vfioDev: -1,
	}
	if f.SRIOVVFs != nil {
		n := *f.SRIOVVFs
		d.sriovVFs = &n
	}
	s.devices[f.BusID] = d
	// An override naming the bound driver is set before the bind, as a
	// node's set-up does (driverctl: driver_override, then drivers_probe);
	// one naming another driver after it, the only order in which it can.
	if f.DriverOverride == f.Driver {
		d.override = f.DriverOverride
	} else {
		defer func() { d.override = f.DriverOverride }()
	}
	if f.Driver == "" {
		return nil
	}
	drv, ok := s.drivers[f.Driver]
	if !ok {
		return fmt.Errorf("driver %q is not loaded", f.Driver)
	}
	if err := s.storeBind(drv, f.BusID); err != nil {
		return fmt.Errorf("driver %q does not take it: %w", f.Driver, err)
	}
	return nil
}
