package vfio

import (
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
)

// Paths in sysfs, relative to its root.
const (
	pciDevicesDir    = "bus/pci/devices"
	pciDriversDir    = "bus/pci/drivers"
	iommuGroupsDir   = "kernel/iommu_groups"
	vfioGroupClass   = "class/vfio"
	miscClass        = "class/misc"
	vfioDevDir       = "vfio-dev"
	noDriverOverride = "(null)" // what the kernel shows for an unset driver_override
)

// busIDPattern is the extended BDF form sysfs names PCI functions by:
// domain:bus:device.function, lower-case hex. Domains have four digits,
// more behind an Intel VMD ("10000:e1:00.0").
var busIDPattern = regexp.MustCompile(`^[0-9a-f]{4,8}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]$`)

// ValidBusID reports whether id is a PCI bus ID in sysfs form, such as
// "0000:1b:00.0". IDs are checked before they become parts of paths.
func ValidBusID(id string) bool { return busIDPattern.MatchString(id) }

func checkBusID(id string) error {
	if !ValidBusID(id) {
		return fmt.Errorf("PCI bus ID %q: want the lower-case form domain:bus:device.function, such as \"0000:1b:00.0\"", id)
	}
	return nil
}

// validDriverName reports whether name can be a PCI driver's directory in
// sysfs, which it becomes part of.
func validDriverName(name string) bool {
	return name != "" && name != "." && name != ".." && !strings.ContainsAny(name, "/\x00\n")
}

func devicePath(busID string, elem ...string) string {
	return strings.Join(append([]string{pciDevicesDir, busID}, elem...), "/")
}

func driverPath(driver string, elem ...string) string {
	return strings.Join(append([]string{pciDriversDir, driver}, elem...), "/")
}

// PCIDevice is what sysfs says about one PCI function, for the device
// attributes of a VFIO device.
type PCIDevice struct {
	// BusID is the function's PCI bus ID, "0000:1b:00.0".
	BusID string
	// VendorID and DeviceID are four lower-case hex digits without "0x",
	// "10de" and "2330".
	VendorID, DeviceID string
	// Class is the six-digit class code without "0x", "030200".
	Class string
	// IOMMUGroup is the function's IOMMU group; nil when the IOMMU is off.
	IOMMUGroup *int
	// Driver is the driver the function is bound to; "" when none.
	Driver string
}

// ReadPCIDevice reads the identity, IOMMU group and driver of the PCI
// function busID. A function sysfs does not know is an error wrapping
// fs.ErrNotExist.
func ReadPCIDevice(fsys FS, busID string) (PCIDevice, error) {
	if err := checkBusID(busID); err != nil {
		return PCIDevice{}, err
	}
	d := PCIDevice{BusID: busID}
	for _, a := range []struct {
		file   string
		digits int
		into   *string
	}{{"vendor", 4, &d.VendorID}, {"device", 4, &d.DeviceID}, {"class", 6, &d.Class}} {
		v, err := readHexAttr(fsys, devicePath(busID, a.file), a.digits)
		if err != nil {
			return PCIDevice{}, fmt.Errorf("PCI device %s: %w", busID, err)
		}
		*a.into = v
	}
	group, err := iommuGroupOf(fsys, busID)
	if err != nil {
		return PCIDevice{}, fmt.Errorf("PCI device %s: %w", busID, err)
	}
	d.IOMMUGroup = group
	if d.Driver, err = linkBase(fsys, devicePath(busID, "driver")); err != nil {
		return PCIDevice{}, fmt.Errorf("PCI device %s: driver: %w", busID, err)
	}
	return d, nil
}

// readHexAttr reads an attribute the kernel prints as "0x" and width hex
// digits, such as vendor ("0x10de"), and returns the digits.
func readHexAttr(fsys FS, name string, width int) (string, error) {
	s, err := readAttr(fsys, name)
	if err != nil {
		return "", err
	}
	digits, ok := strings.CutPrefix(s, "0x")
	if _, err := strconv.ParseUint(digits, 16, 32); err != nil || !ok || len(digits) != width {
		return "", fmt.Errorf("%s: want 0x and %d hex digits, got %q", name, width, s)
	}
	return strings.ToLower(digits), nil
}

// iommuGroupOf returns the IOMMU group of busID, nil when it has none.
func iommuGroupOf(fsys FS, busID string) (*int, error) {
	name := devicePath(busID, "iommu_group")
	base, err := linkBase(fsys, name)
	if err != nil {
		return nil, fmt.Errorf("IOMMU group: %w", err)
	}
	if base == "" {
		return nil, nil
	}
	group, err := strconv.Atoi(base)
	if err != nil || group < 0 {
		return nil, fmt.Errorf("IOMMU group: %s points at %q, not a group number", name, base)
	}
	return &group, nil
}

// IOMMUEnabled reports whether the kernel has IOMMU groups at all, without
// which there is no VFIO passthrough (intel_iommu=on or amd_iommu=on
// missing, or no IOMMU in the machine).
func IOMMUEnabled(fsys FS) (bool, error) {
	groups, err := fsys.ReadDir(iommuGroupsDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("list IOMMU groups: %w", err)
	}
	return len(groups) > 0, nil
}

// IOMMUFDAvailable reports whether the kernel offers iommufd (/dev/iommu).
func IOMMUFDAvailable(fsys FS) (bool, error) {
	ok, err := fsys.Exists(miscClass + "/iommu/dev")
	if err != nil {
		return false, fmt.Errorf("look for iommufd: %w", err)
	}
	return ok, nil
}
