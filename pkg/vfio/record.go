package vfio

import (
	"errors"
	"fmt"
	"slices"
)

// Driver names of the VFIO PCI drivers (also their module names, which
// modprobe accepts with dashes or underscores).
const (
	// VFIOPCI is the generic VFIO PCI driver.
	VFIOPCI = "vfio-pci"
	// NVGraceGPUVFIOPCI is the VFIO variant driver for the GPUs of Grace
	// Hopper and Grace Blackwell superchips, which expose their coherent
	// memory to the guest; plain vfio-pci cannot.
	NVGraceGPUVFIOPCI = "nvgrace-gpu-vfio-pci"
)

// Record is what binding a GPU's IOMMU group to VFIO changes and how to
// undo it. [Binder.Plan] makes it without changing anything; the caller
// persists it (in the plugin's checkpoint) before calling [Binder.Bind], so
// that after a crash at any point [Binder.Restore] can put the group back.
// It is plain JSON and carries everything Restore needs: a plugin restarted
// with other options restores what the record says.
type Record struct {
	// GPU is the PCI bus ID of the GPU the group was bound for.
	GPU string `json:"gpu"`
	// IOMMUGroup is the GPU's IOMMU group.
	IOMMUGroup int `json:"iommuGroup"`
	// Functions are the PCI functions of the group that Bind moves to a
	// VFIO driver, ordered by bus ID; the GPU is among them.
	Functions []Function `json:"functions"`
}

// Function is one PCI function of a bound group.
type Function struct {
	// BusID is the function's PCI bus ID, "0000:1b:00.1".
	BusID string `json:"busID"`
	// Driver is the VFIO driver Bind binds it to.
	Driver string `json:"driver"`
	// OriginalDriver is the driver it was bound to before; "" when it was
	// bound to none, in which case Restore leaves it unbound.
	OriginalDriver string `json:"originalDriver,omitempty"`
	// OriginalDriverOverride is its driver_override before; "" when unset.
	OriginalDriverOverride string `json:"originalDriverOverride,omitempty"`
}

// Validate checks that r is a record Plan could have made, so that a
// corrupt checkpoint cannot steer writes to arbitrary sysfs paths.
func (r *Record) Validate() error {
	var errs []error
	if err := checkBusID(r.GPU); err != nil {
		errs = append(errs, fmt.Errorf("gpu: %w", err))
	}
	if r.IOMMUGroup < 0 {
		errs = append(errs, fmt.Errorf("iommuGroup: %d is negative", r.IOMMUGroup))
	}
	hasGPU := false
	seen := make(map[string]bool, len(r.Functions))
	for i, f := range r.Functions {
		if err := checkBusID(f.BusID); err != nil {
			errs = append(errs, fmt.Errorf("functions[%d].busID: %w", i, err))
		}
		if seen[f.BusID] {
			errs = append(errs, fmt.Errorf("functions[%d].busID: %s is listed twice", i, f.BusID))
		}
		seen[f.BusID] = true
		hasGPU = hasGPU || f.BusID == r.GPU
		if !validDriverName(f.Driver) {
			errs = append(errs, fmt.Errorf("functions[%d].driver: %q is not a driver name", i, f.Driver))
		}
		if f.OriginalDriver != "" && !validDriverName(f.OriginalDriver) {
			errs = append(errs, fmt.Errorf("functions[%d].originalDriver: %q is not a driver name", i, f.OriginalDriver))
		}
		if f.OriginalDriverOverride != "" && !validDriverName(f.OriginalDriverOverride) {
			errs = append(errs, fmt.Errorf("functions[%d].originalDriverOverride: %q is not a driver name", i, f.OriginalDriverOverride))
		}
	}
	if !hasGPU && checkBusID(r.GPU) == nil {
		errs = append(errs, fmt.Errorf("functions: the GPU %s is not among them", r.GPU))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("invalid VFIO record: %w", err)
	}
	return nil
}

// gpuFunction returns the GPU's entry; Validate ensures there is one.
func (r *Record) gpuFunction() Function {
	for _, f := range r.Functions {
		if f.BusID == r.GPU {
			return f
		}
	}
	return Function{}
}

// drivers returns the VFIO drivers of r, each once, in order of appearance.
func (r *Record) drivers() []string {
	var drivers []string
	for _, f := range r.Functions {
		if !slices.Contains(drivers, f.Driver) {
			drivers = append(drivers, f.Driver)
		}
	}
	return drivers
}
