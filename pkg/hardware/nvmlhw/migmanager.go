package nvmlhw

import (
	"context"
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/hardware"
)

var (
	_ hardware.MIGManager      = (*Discoverer)(nil)
	_ hardware.MIGModeSwitcher = (*Discoverer)(nil)
)

// withNVML runs fn with NVML initialized, one operation at a time with
// Discover and the other MIG operations (see [Discoverer]). NVML counts
// its initializations, so this pair nests inside any other user's.
//
// A failing nvmlShutdown after fn is logged, not returned: what fn did to
// the GPU is done, and an error would make the caller believe otherwise.
func (d *Discoverer) withNVML(ctx context.Context, fn func(lib nvml.Interface) error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return err
	}
	lib, source, err := d.open()
	if err != nil {
		return err
	}
	if ret := lib.InitWithFlags(nvml.INIT_FLAG_NO_GPUS); ret != nvml.SUCCESS {
		return initError(source, ret)
	}
	defer func() {
		if ret := lib.Shutdown(); ret != nvml.SUCCESS {
			klog.FromContext(ctx).Error(ret, "nvmlShutdown failed after a MIG operation")
		}
	}()
	return fn(lib)
}

// gpuByUUID returns the handle of the GPU (not MIG device) with the UUID.
func gpuByUUID(lib nvml.Interface, uuid string) (nvml.Device, error) {
	dev, ret := lib.DeviceGetHandleByUUID(uuid)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("find GPU %s: nvmlDeviceGetHandleByUUID: %w", uuid, ret)
	}
	isMIG, ret := dev.IsMigDeviceHandle()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("find GPU %s: nvmlDeviceIsMigDeviceHandle: %w", uuid, ret)
	}
	if isMIG {
		return nil, fmt.Errorf("%s is a MIG device, not a GPU", uuid)
	}
	return dev, nil
}

// migEnabled reports whether the GPU's MIG mode is on now.
func migEnabled(dev nvml.Device) (bool, error) {
	current, _, ret := dev.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		return current == nvml.DEVICE_MIG_ENABLE, nil
	case nvml.ERROR_NOT_SUPPORTED:
		return false, errors.New("the GPU does not support MIG")
	default:
		return false, fmt.Errorf("nvmlDeviceGetMigMode: %w", ret)
	}
}

// CreateMIGDevice implements [hardware.MIGManager]. It creates the GPU
// instance with nvmlDeviceCreateGpuInstanceWithPlacement, then the compute
// instance of the spanning profile (see [hardware.MIGProfile]), and reads
// the new MIG device back with the code Discover uses. NVML answering
// NVML_ERROR_INSUFFICIENT_RESOURCES, which it does for a placement that
// overlaps a GPU instance and for a profile whose instances are all in use
// (the single "+me" instance), yields an error wrapping
// [hardware.ErrPlacementInUse]. ctx is checked between steps; once the GPU
// instance exists, a cancelled ctx rolls it back like any failed step.
func (d *Discoverer) CreateMIGDevice(ctx context.Context, p hardware.MIGPlacement) (hardware.MIGDevice, error) {
	var mig hardware.MIGDevice
	err := d.withNVML(ctx, func(lib nvml.Interface) error {
		var err error
		mig, err = d.createMIGDevice(ctx, lib, p)
		return err
	})
	if err != nil {
		return hardware.MIGDevice{}, fmt.Errorf("create MIG device %s: %w", p, err)
	}
	return mig, nil
}

// createMIGDevice does CreateMIGDevice's work with NVML initialized.
func (d *Discoverer) createMIGDevice(ctx context.Context, lib nvml.Interface, p hardware.MIGPlacement) (_ hardware.MIGDevice, err error) {
	dev, err := gpuByUUID(lib, p.ParentUUID)
	if err != nil {
		return hardware.MIGDevice{}, err
	}
	on, err := migEnabled(dev)
	switch {
	case err != nil:
		return hardware.MIGDevice{}, err
	case !on:
		return hardware.MIGDevice{}, errors.New("MIG mode of the GPU is off")
	}
	// What the read-back needs, read before anything is created.
	minor, ret := dev.GetMinorNumber()
	if ret != nvml.SUCCESS {
		return hardware.MIGDevice{}, fmt.Errorf("nvmlDeviceGetMinorNumber: %w", ret)
	}
	memory, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return hardware.MIGDevice{}, fmt.Errorf("nvmlDeviceGetMemoryInfo (needed to name the profile): %w", ret)
	}
	gpu := hardware.GPU{UUID: p.ParentUUID, Minor: minor, MemoryBytes: memory.Total}
	profiles, err := giProfiles(dev)
	if err != nil {
		return hardware.MIGDevice{}, err
	}
	prof, ok := profiles.byID(uint32(p.ProfileID))
	if !ok {
		return hardware.MIGDevice{}, fmt.Errorf("the GPU has no GPU instance profile with ID %d (profile IDs: %s)", p.ProfileID, profiles.ids())
	}
	placement, err := placementAt(dev, prof, p.Start)
	if err != nil {
		return hardware.MIGDevice{}, err
	}
	ciProfile, err := spanningCIProfile(prof)
	if err != nil {
		return hardware.MIGDevice{}, err
	}
	if err := ctx.Err(); err != nil {
		return hardware.MIGDevice{}, err
	}

	info := prof.info
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &placement)
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_INSUFFICIENT_RESOURCES:
		return hardware.MIGDevice{}, fmt.Errorf("create GPU instance at memory slices %d-%d: %w (or no instance of the profile is left): nvmlDeviceCreateGpuInstanceWithPlacement: %w",
			placement.Start, placement.Start+placement.Size-1, hardware.ErrPlacementInUse, ret)
	default:
		return hardware.MIGDevice{}, fmt.Errorf("create GPU instance: nvmlDeviceCreateGpuInstanceWithPlacement: %w", ret)
	}
	var ci nvml.ComputeInstance
	defer func() {
		if err == nil {
			return
		}
		if rbErr := rollBack(gi, ci); rbErr != nil {
			err = fmt.Errorf("%w (roll back: %w)", err, rbErr)
		}
	}()

	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return hardware.MIGDevice{}, fmt.Errorf("read new GPU instance: nvmlGpuInstanceGetInfo: %w", ret)
	}
	ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciProfile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if ret != nvml.SUCCESS {
		return hardware.MIGDevice{}, fmt.Errorf("create compute instance in GPU instance %d: nvmlGpuInstanceGetComputeInstanceProfileInfo(%d): %w", giInfo.Id, ciProfile, ret)
	}
	if err := ctx.Err(); err != nil {
		return hardware.MIGDevice{}, err
	}
	ci, ret = gi.CreateComputeInstance(&ciInfo)
	if ret != nvml.SUCCESS {
		ci = nil // nothing to destroy, whatever NVML handed back
		return hardware.MIGDevice{}, fmt.Errorf("create compute instance in GPU instance %d: nvmlGpuInstanceCreateComputeInstance: %w", giInfo.Id, ret)
	}
	ciData, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return hardware.MIGDevice{}, fmt.Errorf("read new compute instance: nvmlComputeInstanceGetInfo: %w", ret)
	}
	if err := ctx.Err(); err != nil {
		return hardware.MIGDevice{}, err
	}

	handle, uuid, err := migDeviceOf(dev, int(giInfo.Id), int(ciData.Id))
	if err != nil {
		return hardware.MIGDevice{}, fmt.Errorf("find new MIG device: %w", err)
	}
	g := newGPUReader(lib, d.topo, d.sys)
	mig, err := g.readMIGDevice(dev, gpu, profiles, handle, nil)
	if err != nil {
		return hardware.MIGDevice{}, fmt.Errorf("read new MIG device %s: %w", uuid, err)
	}
	mig.UUID = uuid
	if mig.ProfileID != p.ProfileID || mig.PlacementStart != p.Start {
		return hardware.MIGDevice{}, fmt.Errorf("NVML reports the new MIG device %s as profile %d at %d", uuid, mig.ProfileID, mig.PlacementStart)
	}
	return mig, nil
}

// placementAt returns the placement of profile p that starts at start.
func placementAt(dev nvml.Device, p giProfile, start int) (nvml.GpuInstancePlacement, error) {
	info := p.info
	placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
	if ret != nvml.SUCCESS {
		return nvml.GpuInstancePlacement{}, fmt.Errorf("nvmlDeviceGetGpuInstancePossiblePlacements(profile %d): %w", info.Id, ret)
	}
	starts := make([]string, len(placements))
	for i, pl := range placements {
		if int(pl.Start) == start {
			return pl, nil
		}
		starts[i] = fmt.Sprint(pl.Start)
	}
	return nvml.GpuInstancePlacement{}, fmt.Errorf("%d is not a placement start of GPU instance profile %d (starts: %v)", start, info.Id, starts)
}

// migDeviceOf finds the MIG device of compute instance ciID in GPU instance
// giID and returns its handle and UUID.
func migDeviceOf(dev nvml.Device, giID, ciID int) (nvml.Device, string, error) {
	count, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, "", fmt.Errorf("nvmlDeviceGetMaxMigDeviceCount: %w", ret)
	}
	for j := 0; j < count; j++ {
		handle, ret := dev.GetMigDeviceHandleByIndex(j)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_FOUND, nvml.ERROR_INVALID_ARGUMENT:
			continue
		default:
			return nil, "", fmt.Errorf("nvmlDeviceGetMigDeviceHandleByIndex(%d): %w", j, ret)
		}
		gi, ret := handle.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			return nil, "", fmt.Errorf("MIG device %d: nvmlDeviceGetGpuInstanceId: %w", j, ret)
		}
		ci, ret := handle.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			return nil, "", fmt.Errorf("MIG device %d: nvmlDeviceGetComputeInstanceId: %w", j, ret)
		}
		if gi != giID || ci != ciID {
			continue
		}
		uuid, ret := handle.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, "", fmt.Errorf("MIG device %d: nvmlDeviceGetUUID: %w", j, ret)
		}
		return handle, uuid, nil
	}
	return nil, "", fmt.Errorf("no MIG device has GPU instance %d and compute instance %d", giID, ciID)
}

// rollBack destroys what a failed CreateMIGDevice created: the compute
// instance, if any, then the GPU instance.
func rollBack(gi nvml.GpuInstance, ci nvml.ComputeInstance) error {
	if ci != nil {
		if ret := ci.Destroy(); ret != nvml.SUCCESS {
			return fmt.Errorf("nvmlComputeInstanceDestroy: %w; the compute instance and the GPU instance are left", ret)
		}
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvmlGpuInstanceDestroy: %w; the GPU instance is left", ret)
	}
	return nil
}

// DestroyMIGDevice implements [hardware.MIGManager]. It destroys every
// compute instance of the GPU instance, whatever its profile, then the GPU
// instance. NVML answers NVML_ERROR_IN_USE while processes run on them;
// the error says so and a later call may succeed. A GPU whose MIG mode is
// off holds no GPU instance, so that is nil too.
func (d *Discoverer) DestroyMIGDevice(ctx context.Context, p hardware.MIGPlacement) error {
	err := d.withNVML(ctx, func(lib nvml.Interface) error { return destroyMIGDevice(ctx, lib, p) })
	if err != nil {
		return fmt.Errorf("destroy MIG device %s: %w", p, err)
	}
	return nil
}

func destroyMIGDevice(ctx context.Context, lib nvml.Interface, p hardware.MIGPlacement) error {
	dev, err := gpuByUUID(lib, p.ParentUUID)
	if err != nil {
		return err
	}
	if on, err := migEnabled(dev); err != nil || !on {
		return err
	}
	profiles, err := giProfiles(dev)
	if err != nil {
		return err
	}
	prof, ok := profiles.byID(uint32(p.ProfileID))
	if !ok {
		return fmt.Errorf("the GPU has no GPU instance profile with ID %d (profile IDs: %s)", p.ProfileID, profiles.ids())
	}
	gi, giID, err := gpuInstanceAt(dev, prof, p.Start)
	if err != nil || gi == nil {
		return err
	}
	cis, err := computeInstances(gi)
	if err != nil {
		return fmt.Errorf("GPU instance %d: %w", giID, err)
	}
	for _, ci := range cis {
		if err := ctx.Err(); err != nil {
			return err
		}
		if ret := ci.Destroy(); ret != nvml.SUCCESS {
			return fmt.Errorf("destroy compute instance of GPU instance %d: nvmlComputeInstanceDestroy: %w%s", giID, ret, inUseHint(ret))
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if ret := gi.Destroy(); ret != nvml.SUCCESS {
		return fmt.Errorf("destroy GPU instance %d: nvmlGpuInstanceDestroy: %w%s", giID, ret, inUseHint(ret))
	}
	return nil
}

// inUseHint explains NVML_ERROR_IN_USE in errors.
func inUseHint(ret nvml.Return) string {
	if ret == nvml.ERROR_IN_USE {
		return " (processes still use it; retry once they are gone)"
	}
	return ""
}

// gpuInstanceAt returns the GPU instance of profile p at start, and its ID,
// or nil when there is none.
func gpuInstanceAt(dev nvml.Device, p giProfile, start int) (nvml.GpuInstance, uint32, error) {
	gis, err := gpuInstances(dev, p)
	if err != nil {
		return nil, 0, err
	}
	for _, gi := range gis {
		info, ret := gi.GetInfo()
		if ret != nvml.SUCCESS {
			return nil, 0, fmt.Errorf("nvmlGpuInstanceGetInfo: %w", ret)
		}
		if int(info.Placement.Start) == start {
			return gi, info.Id, nil
		}
	}
	return nil, 0, nil
}

// gpuInstances lists the GPU instances of profile p.
func gpuInstances(dev nvml.Device, p giProfile) ([]nvml.GpuInstance, error) {
	info := p.info
	// go-nvml sizes its buffer by InstanceCount and indexes it, so a
	// profile without instances must not get that far.
	if info.InstanceCount == 0 {
		return nil, nil
	}
	gis, ret := dev.GetGpuInstances(&info)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvmlDeviceGetGpuInstances(profile %d): %w", info.Id, ret)
	}
	return gis, nil
}

// computeInstances lists the compute instances of gi, of every profile.
func computeInstances(gi nvml.GpuInstance) ([]nvml.ComputeInstance, error) {
	var all []nvml.ComputeInstance
	for p := 0; p < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; p++ {
		for e := 0; e < nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT; e++ {
			info, ret := gi.GetComputeInstanceProfileInfo(p, e)
			switch ret {
			case nvml.SUCCESS:
			case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT:
				continue
			default:
				return nil, fmt.Errorf("nvmlGpuInstanceGetComputeInstanceProfileInfo(%d, %d): %w", p, e, ret)
			}
			if info.InstanceCount == 0 {
				continue // see gpuInstances
			}
			cis, ret := gi.GetComputeInstances(&info)
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("nvmlGpuInstanceGetComputeInstances(profile %d): %w", info.Id, ret)
			}
			all = append(all, cis...)
		}
	}
	return all, nil
}
