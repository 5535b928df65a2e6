// Package fakesysfs is an in-memory sysfs that behaves like the kernel's
// PCI and VFIO parts of it, for tests and simulated nodes.
//
// It implements vfio.FS, and its writes have the kernel's effects rather
// than being recorded: a write to bus/pci/drivers/<d>/bind moves the
// device's driver link, but only when the device is unbound (EBUSY
// otherwise) and driver_override is unset or names d and the driver
// matches the device (ENODEV otherwise); a write to
// bus/pci/devices/<bdf>/driver/unbind removes the link, and fails with EBUSY
// while the device has holders; bus/pci/drivers_probe binds a device to its
// driver_override, or to a matching driver; binding to a VFIO driver
// creates vfio-dev/vfio<N> under the device and the group's class/vfio/<N>
// node; a driver whose module is not loaded has no directory, so writing to
// its bind file fails with ENOENT until Load loads the module.
//
// It also implements vfio.ModuleLoader (Load) and vfio.BusyChecker
// (Holders), injects faults per operation and path (InjectFault),
// simulates a crash of the process using it (CrashAfterWrites, Restart),
// and can keep the kernel's state in a file that outlives the process
// (Builder.StateFile; see state.go).
package fakesysfs

import (
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/gpudra/gpudra/pkg/vfio"
)

var (
	_ vfio.FS           = (*Sysfs)(nil)
	_ vfio.ModuleLoader = (*Sysfs)(nil)
	_ vfio.BusyChecker  = (*Sysfs)(nil)
)

// Character device numbers the fake gives VFIO's nodes. The misc ones are
// the kernel's; the dynamic majors are what a typical x86 host shows.
const (
	MiscMajor      = 10
	VFIOMiscMinor  = 196 // /dev/vfio/vfio
	IOMMUMiscMinor = 126 // /dev/iommu (a dynamic misc minor on real hosts)
	VFIOGroupMajor = 508 // /dev/vfio/<group>, "vfio" in /proc/devices
	VFIODevMajor   = 507 // /dev/vfio/devices/vfio<N>, "vfio-dev"
)

// Sysfs is the fake. Its methods are safe for concurrent use.
type Sysfs struct {
	mu      sync.Mutex
	root    string
	devices map[string]*device
	drivers map[string]*driver // registered: built in or module loaded
	modules map[string]*driver // available, module not loaded
	iommufd bool
	noIOMMU bool
	// groupMinors maps IOMMU groups that have a VFIO group node to its
	// minor; devMinors is the set of vfio-dev minors in use.
	groupMinors map[int]int
	devMinors   map[int]bool

	// stateFile, if set, keeps the kernel's state (state.go), shared with
	// the other processes that drive it (shared.go): lockFile locks it,
	// lastState is what this process last read or wrote of it.
	stateFile string
	lastState []byte

	faults     []*Fault
	crashAfter int // successful writes left before the crash; -1 for none
	crashed    bool
	writes     int
	onWrite    []func(name string)
}

// device is one PCI function.
type device struct {
	busID, vendor, deviceID, class string
	group                          int
	driver                         string // "" when unbound
	override                       string // "" when unset
	holders                        []string
	sriovVFs                       *int
	vfioDev                        int // N of vfio-dev/vfio<N>; -1 for none
}

// driver is a PCI driver.
type driver struct {
	name    string
	vfio    bool
	matches []Match
}

// Match is one entry of a driver's ID table. Empty fields match anything;
// a driver without entries (vfio-pci) binds only devices whose
// driver_override names it.
type Match struct {
	// Vendor is four lower-case hex digits, "10de".
	Vendor string
	// ClassPrefix is the start of the six-digit class code, "03" for
	// display controllers, "0403" for audio.
	ClassPrefix string
}

func (d *driver) matchesDevice(dev *device) bool {
	for _, m := range d.matches {
		if (m.Vendor == "" || m.Vendor == dev.vendor) && len(dev.class) >= len(m.ClassPrefix) && dev.class[:len(m.ClassPrefix)] == m.ClassPrefix {
			return true
		}
	}
	return false
}

// Binding is how a function is bound.
type Binding struct {
	// Driver is the driver it is bound to; "" when unbound.
	Driver string
	// Override is its driver_override; "" when unset.
	Override string
}

// Bindings returns the binding of every function, by bus ID; tests compare
// it before and after an operation.
func (s *Sysfs) Bindings() map[string]Binding {
	defer s.lock()()
	out := make(map[string]Binding, len(s.devices))
	for id, d := range s.devices {
		out[id] = Binding{Driver: d.driver, Override: d.override}
	}
	return out
}

// Binding returns the binding of busID, false for an unknown function.
func (s *Sysfs) Binding(busID string) (Binding, bool) {
	defer s.lock()()
	d, ok := s.devices[busID]
	if !ok {
		return Binding{}, false
	}
	return Binding{Driver: d.driver, Override: d.override}, true
}

// VFIODevice returns N of the function's /dev/vfio/devices/vfio<N>, false
// when it is not bound to a VFIO driver.
func (s *Sysfs) VFIODevice(busID string) (int, bool) {
	defer s.lock()()
	d, ok := s.devices[busID]
	if !ok || d.vfioDev < 0 {
		return 0, false
	}
	return d.vfioDev, true
}

// VFIOGroups returns the IOMMU groups that have a /dev/vfio/<group> node,
// sorted.
func (s *Sysfs) VFIOGroups() []int {
	defer s.lock()()
	return slices.Sorted(maps.Keys(s.groupMinors))
}

// DriverLoaded reports whether the driver is registered (its module
// loaded).
func (s *Sysfs) DriverLoaded(name string) bool {
	defer s.lock()()
	_, ok := s.drivers[name]
	return ok
}

// SetHolders marks busID as held by holders (none: free). Holders reports
// them, and unbinding the function fails with EBUSY while it has any.
func (s *Sysfs) SetHolders(busID string, holders ...string) error {
	defer s.lock()()
	d, ok := s.devices[busID]
	if !ok {
		return fmt.Errorf("fake sysfs: no PCI function %s", busID)
	}
	d.holders = slices.Clone(holders)
	return nil
}

// bind attaches dev to drv, with the side effects of a VFIO driver's probe.
func (s *Sysfs) bind(dev *device, drv *driver) {
	dev.driver = drv.name
	if !drv.vfio {
		return
	}
	dev.vfioDev = lowestFree(s.devMinors)
	s.devMinors[dev.vfioDev] = true
	if _, ok := s.groupMinors[dev.group]; !ok {
		used := make(map[int]bool, len(s.groupMinors))
		for _, m := range s.groupMinors {
			used[m] = true
		}
		s.groupMinors[dev.group] = lowestFree(used)
	}
}

// unbind detaches dev from its driver; a VFIO driver's remove drops the
// device's node and, with the group's last VFIO device, the group's node.
func (s *Sysfs) unbind(dev *device) {
	dev.driver = ""
	if dev.vfioDev < 0 {
		return
	}
	delete(s.devMinors, dev.vfioDev)
	dev.vfioDev = -1
	for _, other := range s.devices {
		if other.group == dev.group && other.vfioDev >= 0 {
			return
		}
	}
	delete(s.groupMinors, dev.group)
}

// vfioCoreLoaded reports whether a VFIO driver is registered, which brings
// the VFIO core and its /dev/vfio/vfio.
func (s *Sysfs) vfioCoreLoaded() bool {
	for _, d := range s.drivers {
		if d.vfio {
			return true
		}
	}
	return false
}

func lowestFree(used map[int]bool) int {
	n := 0
	for used[n] {
		n++
	}
	return n
}
