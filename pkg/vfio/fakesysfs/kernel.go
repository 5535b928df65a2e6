package fakesysfs

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"syscall"
)

// The stores of sysfs attributes, as the kernel implements them
// (drivers/base/bus.c, drivers/pci/pci-sysfs.c). Each runs with s.mu held
// and returns an errno.

// storeBind is a write to bus/pci/drivers/<drv>/bind.
func (s *Sysfs) storeBind(drv *driver, value string) error {
	dev, ok := s.devices[strings.TrimSpace(value)]
	switch {
	case !ok:
		return syscall.ENODEV
	case dev.override != "" && dev.override != drv.name:
		return syscall.ENODEV // pci_match_device: the override excludes other drivers
	case dev.override == "" && !drv.matchesDevice(dev):
		return syscall.ENODEV
	case dev.driver != "":
		return syscall.EBUSY
	case drv.vfio && s.noIOMMU:
		return syscall.EINVAL // vfio_pci_core_register_device: no IOMMU group
	}
	s.bind(dev, drv)
	return nil
}

// storeUnbind is a write to bus/pci/drivers/<drv>/unbind, which
// bus/pci/devices/<bdf>/driver/unbind leads to.
func (s *Sysfs) storeUnbind(drv *driver, value string) error {
	dev, ok := s.devices[strings.TrimSpace(value)]
	switch {
	case !ok || dev.driver != drv.name:
		return syscall.ENODEV
	case len(dev.holders) > 0:
		// The real kernel waits for the holders instead; the fake fails
		// fast so that a test cannot hang.
		return syscall.EBUSY
	}
	s.unbind(dev)
	return nil
}

// storeProbe is a write to bus/pci/drivers_probe: an unbound device is
// attached to the first driver that takes it, which is its driver_override
// when set. No taker is not an error.
func (s *Sysfs) storeProbe(value string) error {
	dev, ok := s.devices[strings.TrimSpace(value)]
	if !ok {
		return syscall.ENODEV
	}
	if dev.driver != "" {
		return nil
	}
	if dev.override != "" {
		if drv, ok := s.drivers[dev.override]; ok && !(drv.vfio && s.noIOMMU) {
			s.bind(dev, drv)
		}
		return nil
	}
	for _, name := range slices.Sorted(maps.Keys(s.drivers)) {
		if drv := s.drivers[name]; drv.matchesDevice(dev) {
			s.bind(dev, drv)
			return nil
		}
	}
	return nil
}

// storeOverride is a write to bus/pci/devices/<bdf>/driver_override: the
// value up to a newline; an empty one clears it.
func (s *Sysfs) storeOverride(dev *device, value string) error {
	value, _, _ = strings.Cut(value, "\n")
	if len(value) >= 4096 {
		return syscall.EINVAL
	}
	dev.override = value
	return nil
}

// Load implements vfio.ModuleLoader: it registers the driver of a module
// the fake knows, as modprobe would. Dashes and underscores in the name are
// alike, as for modprobe.
func (s *Sysfs) Load(ctx context.Context, module string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	defer s.lock()()
	switch f := s.fault(OpLoadModule, module); {
	case f != nil && f.Drop:
		return nil
	case f != nil:
		return f.Err
	}
	return s.change(func() error { return s.load(module) })
}

func (s *Sysfs) load(module string) error {
	name := strings.ReplaceAll(module, "_", "-")
	for _, known := range []string{module, name} {
		if _, ok := s.drivers[known]; ok {
			return nil
		}
		if drv, ok := s.modules[known]; ok {
			delete(s.modules, known)
			s.drivers[known] = drv
			return nil
		}
	}
	return fmt.Errorf("modprobe: FATAL: Module %s not found", module)
}

// Holders implements vfio.BusyChecker with the holders SetHolders gave.
func (s *Sysfs) Holders(ctx context.Context, busID string) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	defer s.lock()()
	if err := s.failure(OpHolders, busID); err != nil {
		return nil, err
	}
	d, ok := s.devices[busID]
	if !ok {
		return nil, fmt.Errorf("fake sysfs: no PCI function %s", busID)
	}
	return slices.Clone(d.holders), nil
}
