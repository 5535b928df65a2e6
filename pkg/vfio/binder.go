package vfio

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Binder moves the PCI functions of a GPU's IOMMU group to VFIO drivers and
// back: [Binder.Plan] reads sysfs and returns the [Record] of what it would
// change, [Binder.Bind] carries it out and [Binder.Restore] undoes it.
//
// A Binder is safe for concurrent use on different groups; callers must not
// bind or restore one group from two goroutines at once (the kubelet
// plugin prepares one claim per device at a time anyway). A process should
// use one Binder, which remembers writes still in progress.
//
// Every step is a single sysfs write, which a context cannot interrupt: an
// unbind waits in the kernel until the device's last user lets go. A step
// still running when the context ends is left to finish in the background;
// the call returns an error wrapping [ErrInFlight], and until the write
// returns, the Binder refuses further writes to that function.
type Binder struct {
	fs              FS
	busy            BusyChecker
	modules         ModuleLoader
	gpuDriver       string
	rollbackTimeout time.Duration

	mu       sync.Mutex
	inFlight map[string]*pendingWrite // by bus ID
}

// pendingWrite is a sysfs write that has not returned.
type pendingWrite struct {
	step string
	done chan struct{} // closed when the write returns
}

// ErrInFlight marks a step given up on while its sysfs write had not
// returned, or while an earlier one on the same function had not. Restore
// succeeds once the write returns.
var ErrInFlight = errors.New("sysfs write still in progress")

// DefaultRollbackTimeout bounds the rollback of a failed Bind, which runs
// after the caller's context may have ended.
const DefaultRollbackTimeout = 10 * time.Second

// Option configures a [Binder].
type Option func(*Binder)

// WithGPUDriver sets the VFIO driver the GPU itself is bound to:
// [VFIOPCI] (the default) or [NVGraceGPUVFIOPCI] on Grace systems. The other
// functions of its group (the GPU's audio function) always get vfio-pci.
func WithGPUDriver(driver string) Option {
	return func(b *Binder) { b.gpuDriver = driver }
}

// WithRollbackTimeout bounds the rollback of a failed Bind; the default is
// [DefaultRollbackTimeout].
func WithRollbackTimeout(d time.Duration) Option {
	return func(b *Binder) { b.rollbackTimeout = d }
}

// NewBinder returns a Binder working on fsys, which asks busy whether a GPU
// is held before unbinding it and loads VFIO driver modules through
// modules.
func NewBinder(fsys FS, busy BusyChecker, modules ModuleLoader, opts ...Option) (*Binder, error) {
	b := &Binder{
		fs: fsys, busy: busy, modules: modules, gpuDriver: VFIOPCI,
		rollbackTimeout: DefaultRollbackTimeout, inFlight: make(map[string]*pendingWrite),
	}
	for _, o := range opts {
		o(b)
	}
	switch {
	case fsys == nil || busy == nil || modules == nil:
		return nil, errors.New("VFIO binder: sysfs, busy checker and module loader are all required")
	case !validDriverName(b.gpuDriver):
		return nil, fmt.Errorf("VFIO binder: GPU driver %q is not a driver name", b.gpuDriver)
	case b.rollbackTimeout <= 0:
		return nil, fmt.Errorf("VFIO binder: rollback timeout %s is not positive", b.rollbackTimeout)
	}
	return b, nil
}

// Bind binds every function of rec to its VFIO driver. The caller must have
// persisted rec before, so that a crash halfway can be undone with Restore.
//
// Bind refuses a GPU its BusyChecker reports held, and a group that
// differs from rec (functions added or removed, or one bound to a third
// driver since Plan). It loads the VFIO driver modules before changing
// anything. Functions already bound as rec wants are left alone, so Bind may
// be repeated. If Bind fails, it restores rec before returning, even when
// ctx is done (within the rollback timeout), because a half-bound group
// serves nobody; the error then includes the rollback's own failure, if
// any.
func (b *Binder) Bind(ctx context.Context, rec Record) error {
	if err := rec.Validate(); err != nil {
		return err
	}
	logger := klog.FromContext(ctx).WithValues("gpu", rec.GPU, "iommuGroup", rec.IOMMUGroup)
	err := b.bind(ctx, rec)
	if err == nil {
		logger.V(2).Info("Bound IOMMU group to VFIO")
		return nil
	}
	err = fmt.Errorf("bind IOMMU group %d of GPU %s to VFIO: %w", rec.IOMMUGroup, rec.GPU, err)
	logger.Info("Rolling back VFIO binding", "err", err)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.rollbackTimeout)
	defer cancel()
	if rerr := b.restore(rctx, rec); rerr != nil {
		return errors.Join(err, fmt.Errorf("roll back: %w", rerr))
	}
	return err
}

func (b *Binder) bind(ctx context.Context, rec Record) error {
	for _, f := range rec.Functions {
		if err := b.settle(ctx, f.BusID); err != nil {
			return fmt.Errorf("function %s: %w", f.BusID, err)
		}
	}
	states, err := b.checkGroup(rec)
	if err != nil {
		return err
	}
	if gpu := states[rec.GPU]; gpu.driver != rec.gpuFunction().Driver {
		holders, err := b.busy.Holders(ctx, rec.GPU)
		switch {
		case err != nil:
			return fmt.Errorf("check whether GPU %s is in use: %w", rec.GPU, err)
		case len(holders) > 0:
			return &BusyError{GPU: rec.GPU, Holders: holders}
		}
	}
	for _, driver := range rec.drivers() {
		if err := b.ensureDriver(ctx, driver); err != nil {
			return err
		}
	}
	for _, f := range rec.Functions {
		if err := b.bindFunction(ctx, f, states[f.BusID]); err != nil {
			return fmt.Errorf("function %s: %w", f.BusID, err)
		}
	}
	return nil
}

// checkGroup returns the state of each function of rec after checking that
// the group still has exactly rec's functions, each bound to its original
// driver, its VFIO driver or none.
func (b *Binder) checkGroup(rec Record) (map[string]functionState, error) {
	members, err := b.groupFunctions(rec.IOMMUGroup)
	if err != nil {
		return nil, err
	}
	recorded := make([]string, len(rec.Functions))
	for i, f := range rec.Functions {
		recorded[i] = f.BusID
	}
	slices.Sort(recorded)
	if !slices.Equal(members, recorded) {
		return nil, fmt.Errorf("IOMMU group %d now holds %v, not the planned %v", rec.IOMMUGroup, members, recorded)
	}
	states := make(map[string]functionState, len(rec.Functions))
	for _, f := range rec.Functions {
		st, err := b.state(f.BusID)
		if err != nil {
			return nil, fmt.Errorf("function %s: %w", f.BusID, err)
		}
		if st.driver != "" && st.driver != f.OriginalDriver && st.driver != f.Driver {
			return nil, fmt.Errorf("function %s is bound to %s, neither its original driver %q nor %s", f.BusID, st.driver, f.OriginalDriver, f.Driver)
		}
		states[f.BusID] = st
	}
	return states, nil
}

// ensureDriver loads the module of a VFIO driver unless the driver is
// registered already.
func (b *Binder) ensureDriver(ctx context.Context, driver string) error {
	dir := driverPath(driver)
	switch ok, err := b.fs.Exists(dir); {
	case err != nil:
		return fmt.Errorf("look up driver %s: %w", driver, err)
	case ok:
		return nil
	}
	if err := b.modules.Load(ctx, driver); err != nil {
		return fmt.Errorf("load module %s: %w", driver, err)
	}
	ok, err := b.fs.Exists(dir)
	switch {
	case err != nil:
		return fmt.Errorf("look up driver %s: %w", driver, err)
	case !ok:
		return fmt.Errorf("module %s loaded, but no driver %s appeared (%s is missing)", driver, driver, dir)
	}
	return nil
}

// bindFunction sets f's driver_override to its VFIO driver, unbinds it from
// its driver and binds it to the VFIO driver, skipping what is done.
func (b *Binder) bindFunction(ctx context.Context, f Function, st functionState) error {
	if st.override != f.Driver {
		if err := b.write(ctx, f.BusID, "set driver_override to "+f.Driver, devicePath(f.BusID, "driver_override"), f.Driver); err != nil {
			return err
		}
	}
	if st.driver == f.Driver {
		return nil
	}
	if st.driver != "" {
		if err := b.write(ctx, f.BusID, "unbind from "+st.driver, devicePath(f.BusID, "driver", "unbind"), f.BusID); err != nil {
			return err
		}
	}
	if err := b.write(ctx, f.BusID, "bind to "+f.Driver, driverPath(f.Driver, "bind"), f.BusID); err != nil {
		return err
	}
	return b.verifyDriver(f.BusID, f.Driver)
}

// write carries out one step on the function busID: a write of value to
// the sysfs file name, unless ctx is done. A write that has not returned
// when ctx ends goes on in the background; see [Binder].
func (b *Binder) write(ctx context.Context, busID, step, name, value string) error {
	p, err := b.start(ctx, busID, step)
	if err != nil {
		return fmt.Errorf("%s: not started: %w", step, err)
	}
	klog.FromContext(ctx).V(4).Info("Writing to sysfs", "function", busID, "step", step, "file", name, "value", value)
	result := make(chan error, 1)
	go func() {
		err := b.fs.WriteFile(name, []byte(value))
		b.mu.Lock()
		delete(b.inFlight, busID)
		b.mu.Unlock()
		close(p.done)
		result <- err
	}()
	select {
	case err = <-result:
	case <-ctx.Done():
		select {
		case err = <-result:
		default:
			return fmt.Errorf("%s: %w, gave up: %w", step, ErrInFlight, context.Cause(ctx))
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", step, err)
	}
	return nil
}

// start registers a write to busID once no other one is pending, and
// unless ctx is done.
func (b *Binder) start(ctx context.Context, busID, step string) (*pendingWrite, error) {
	for {
		if err := context.Cause(ctx); err != nil {
			return nil, err
		}
		b.mu.Lock()
		p, pending := b.inFlight[busID]
		if !pending {
			p = &pendingWrite{step: step, done: make(chan struct{})}
			b.inFlight[busID] = p
			b.mu.Unlock()
			return p, nil
		}
		b.mu.Unlock()
		if err := waitFor(ctx, p); err != nil {
			return nil, err
		}
	}
}

// settle waits until no write to busID is pending, or ctx ends.
func (b *Binder) settle(ctx context.Context, busID string) error {
	b.mu.Lock()
	p, pending := b.inFlight[busID]
	b.mu.Unlock()
	if !pending {
		return nil
	}
	return waitFor(ctx, p)
}

func waitFor(ctx context.Context, p *pendingWrite) error {
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%w (%s), gave up waiting: %w", ErrInFlight, p.step, context.Cause(ctx))
	}
}

// verifyDriver checks that busID is bound to driver: a successful write to
// bind normally says so, but a probe that declines the device is silent
// with drivers_probe and some kernels.
func (b *Binder) verifyDriver(busID, driver string) error {
	got, err := linkBase(b.fs, devicePath(busID, "driver"))
	switch {
	case err != nil:
		return fmt.Errorf("verify binding: read driver: %w", err)
	case got != driver:
		return fmt.Errorf("verify binding: bound to %q after binding to %s", got, driver)
	}
	return nil
}
