package vfio

import (
	"context"
	"errors"
	"fmt"

	"k8s.io/klog/v2"
)

// Restore puts every function of rec back: unbound from its VFIO driver,
// driver_override as it was, bound to its original driver (or to none if it
// had none). It works from any state Bind can leave behind, including a
// crash between any two steps, and does nothing to a function that is as
// it was, so calling it again, or on a group Bind never touched, is safe.
//
// A function bound to a driver that is neither its VFIO driver nor its
// original one is left alone and reported: someone else has taken it. One
// function's failure does not stop the others; the error joins them all.
// A function with a write still pending from an earlier call (see
// [ErrInFlight]) is restored once the write returns. When ctx is done,
// Restore stops before the next step and says so; calling it again finishes
// the job.
func (b *Binder) Restore(ctx context.Context, rec Record) error {
	if err := rec.Validate(); err != nil {
		return err
	}
	if err := b.restore(ctx, rec); err != nil {
		return fmt.Errorf("restore IOMMU group %d of GPU %s: %w", rec.IOMMUGroup, rec.GPU, err)
	}
	klog.FromContext(ctx).V(2).Info("Restored IOMMU group from VFIO", "gpu", rec.GPU, "iommuGroup", rec.IOMMUGroup)
	return nil
}

func (b *Binder) restore(ctx context.Context, rec Record) error {
	var errs []error
	for i := len(rec.Functions) - 1; i >= 0; i-- {
		f := rec.Functions[i]
		if err := context.Cause(ctx); err != nil {
			errs = append(errs, fmt.Errorf("function %s: not restored: %w", f.BusID, err))
			break
		}
		if err := b.settle(ctx, f.BusID); err != nil {
			errs = append(errs, fmt.Errorf("function %s: not restored: %w", f.BusID, err))
			continue
		}
		if err := b.restoreFunction(ctx, f); err != nil {
			errs = append(errs, fmt.Errorf("function %s: %w", f.BusID, err))
		}
	}
	return errors.Join(errs...)
}

func (b *Binder) restoreFunction(ctx context.Context, f Function) error {
	st, err := b.state(f.BusID)
	if err != nil {
		return err
	}
	rebind := st.driver != f.OriginalDriver
	if rebind && st.driver != "" {
		if st.driver != f.Driver {
			return fmt.Errorf("bound to %s, neither its original driver %q nor %s: left as it is", st.driver, f.OriginalDriver, f.Driver)
		}
		if err := b.write(ctx, f.BusID, "unbind from "+st.driver, devicePath(f.BusID, "driver", "unbind"), f.BusID); err != nil {
			return err
		}
	}
	// While the override names another driver, the kernel refuses to bind
	// the original one; an original override that did not match the
	// original driver is put back only after the bind.
	override := f.OriginalDriverOverride
	if rebind && f.OriginalDriver != "" && override != "" && override != f.OriginalDriver {
		override = ""
	}
	if err := b.setOverride(ctx, f.BusID, st.override, override); err != nil {
		return err
	}
	if rebind && f.OriginalDriver != "" {
		if err := b.write(ctx, f.BusID, "bind to original driver "+f.OriginalDriver, driverPath(f.OriginalDriver, "bind"), f.BusID); err != nil {
			return err
		}
		if err := b.verifyDriver(f.BusID, f.OriginalDriver); err != nil {
			return err
		}
	}
	return b.setOverride(ctx, f.BusID, override, f.OriginalDriverOverride)
}

// setOverride changes the driver_override of busID from current to want,
// clearing it for "".
func (b *Binder) setOverride(ctx context.Context, busID, current, want string) error {
	if current == want {
		return nil
	}
	if want == "" {
		// A lone newline clears the override; an empty write may never
		// reach the kernel.
		return b.write(ctx, busID, "clear driver_override", devicePath(busID, "driver_override"), "\n")
	}
	return b.write(ctx, busID, "restore driver_override "+want, devicePath(busID, "driver_override"), want)
}
