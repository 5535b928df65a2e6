package sim

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// fakeGI is a GPU instance. A destroyed one's handle is invalid, as in
// NVML: its calls answer NVML_ERROR_INVALID_ARGUMENT.
type fakeGI struct {
	mock.GpuInstance
	parent  *fakeDevice
	profile *MIGProfile
	id      int
	start   int

	// Guarded by parent.nv.mu.
	cis       []*fakeCI
	destroyed bool
}

// newGI returns a GPU instance of profile p at start on d, not yet listed
// on d. GPU instance IDs follow the driver's numbering of the memory-slice
// blocks as a binary tree: the whole GPU is 0, halves 1-2, quarters 3-6,
// eighths 7-14 (nvidia-smi mig -lgi shows 1g at start s as GI 7+s, 4g at 0
// as GI 1, 3g at 4 as GI 2). Two GPU instances that do not overlap never
// share a block, so never an ID.
func (d *fakeDevice) newGI(p *MIGProfile, start int) *fakeGI {
	return &fakeGI{
		parent: d, profile: p, start: start,
		id: d.model.MemorySlices/p.PlacementSize - 1 + start/p.PlacementSize,
	}
}

// addCI adds compute instance id of c slices at start to gi, with the MIG
// device uuid, and returns it. The caller holds nv.mu or is building the
// fake.
func (gi *fakeGI) addCI(id, start, c int, uuid string) *fakeCI {
	ci := &fakeCI{gi: gi, id: id, start: start, slices: c, profile: gi.profile.ciProfile(c)}
	gi.cis = append(gi.cis, ci)
	gi.parent.migs = append(gi.parent.migs, &fakeMIG{gi: gi, ci: ci, uuid: uuid})
	return ci
}

// GetInfo implements nvml.GpuInstance.
func (gi *fakeGI) GetInfo() (nvml.GpuInstanceInfo, nvml.Return) {
	if ret := gi.parent.hit("nvmlGpuInstanceGetInfo"); ret != nvml.SUCCESS {
		return nvml.GpuInstanceInfo{}, ret
	}
	if !gi.alive() {
		return nvml.GpuInstanceInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}
	return nvml.GpuInstanceInfo{
		Device:    gi.parent,
		Id:        uint32(gi.id),
		ProfileId: uint32(gi.profile.ID),
		Placement: nvml.GpuInstancePlacement{Start: uint32(gi.start), Size: uint32(gi.profile.PlacementSize)},
	}, nvml.SUCCESS
}

// alive reports whether gi has not been destroyed.
func (gi *fakeGI) alive() bool {
	defer gi.parent.nv.lock()()
	return !gi.destroyed
}

// GetComputeInstanceProfileInfo implements nvml.GpuInstance for the
// compute instance sizes the GPU instance allows (see
// [MIGProfile.computeSlices]).
func (gi *fakeGI) GetComputeInstanceProfileInfo(profile, engProfile int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
	if ret := gi.parent.hit("nvmlGpuInstanceGetComputeInstanceProfileInfo"); ret != nvml.SUCCESS {
		return nvml.ComputeInstanceProfileInfo{}, ret
	}
	if !gi.alive() || profile < 0 || profile >= nvml.COMPUTE_INSTANCE_PROFILE_COUNT ||
		engProfile < 0 || engProfile >= nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}
	if engProfile != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	for _, c := range gi.profile.computeSlices() {
		if gi.profile.ciProfile(c) == profile {
			return gi.profile.ciInfo(c), nvml.SUCCESS
		}
	}
	return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
}

// GetComputeInstances implements nvml.GpuInstance.
func (gi *fakeGI) GetComputeInstances(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
	if ret := gi.parent.hit("nvmlGpuInstanceGetComputeInstances"); ret != nvml.SUCCESS {
		return nil, ret
	}
	defer gi.parent.nv.lock()()
	if gi.destroyed || info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	var out []nvml.ComputeInstance
	for _, ci := range gi.cis {
		if uint32(ci.profile) == info.Id {
			out = append(out, ci)
		}
	}
	return out, nvml.SUCCESS
}

// GetComputeInstanceById implements nvml.GpuInstance.
func (gi *fakeGI) GetComputeInstanceById(id int) (nvml.ComputeInstance, nvml.Return) {
	if ret := gi.parent.hit("nvmlGpuInstanceGetComputeInstanceById"); ret != nvml.SUCCESS {
		return nil, ret
	}
	defer gi.parent.nv.lock()()
	if gi.destroyed {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	for _, ci := range gi.cis {
		if ci.id == id {
			return ci, nvml.SUCCESS
		}
	}
	return nil, nvml.ERROR_NOT_FOUND
}

// fakeCI is a compute instance of slices compute slices from start within
// its GPU instance. A destroyed one's handle is invalid.
type fakeCI struct {
	mock.ComputeInstance
	gi      *fakeGI
	id      int
	start   int
	slices  int
	profile int // NVML_COMPUTE_INSTANCE_PROFILE_*

	destroyed bool // guarded by gi.parent.nv.mu
}

// GetInfo implements nvml.ComputeInstance.
func (ci *fakeCI) GetInfo() (nvml.ComputeInstanceInfo, nvml.Return) {
	if ret := ci.gi.parent.hit("nvmlComputeInstanceGetInfo"); ret != nvml.SUCCESS {
		return nvml.ComputeInstanceInfo{}, ret
	}
	if !ci.alive() {
		return nvml.ComputeInstanceInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}
	return nvml.ComputeInstanceInfo{
		Device:      ci.gi.parent,
		GpuInstance: ci.gi,
		Id:          uint32(ci.id),
		ProfileId:   uint32(ci.profile),
		Placement:   nvml.ComputeInstancePlacement{Start: uint32(ci.start), Size: uint32(ci.slices)},
	}, nvml.SUCCESS
}

// alive reports whether ci has not been destroyed.
func (ci *fakeCI) alive() bool {
	defer ci.gi.parent.nv.lock()()
	return !ci.destroyed
}

// fakeMIG is the device handle of a MIG device: one compute instance. It
// is invalid once its compute instance is destroyed.
type fakeMIG struct {
	mock.Device
	gi   *fakeGI
	ci   *fakeCI
	uuid string
}

// enter counts a call of the named function and checks that the handle is
// still valid.
func (m *fakeMIG) enter(call string) nvml.Return {
	if ret := m.gi.parent.hit(call); ret != nvml.SUCCESS {
		return ret
	}
	if !m.ci.alive() {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	return nvml.SUCCESS
}

// GetUUID implements nvml.Device.
func (m *fakeMIG) GetUUID() (string, nvml.Return) {
	if ret := m.enter("nvmlDeviceGetUUID"); ret != nvml.SUCCESS {
		return "", ret
	}
	return m.uuid, nvml.SUCCESS
}

// GetName implements nvml.Device, as "<parent name> MIG <profile>", where
// the profile of a compute instance smaller than its GPU instance reads
// "<c>c.<GPU instance profile>".
func (m *fakeMIG) GetName() (string, nvml.Return) {
	if ret := m.enter("nvmlDeviceGetName"); ret != nvml.SUCCESS {
		return "", ret
	}
	profile := m.gi.profile.Name
	if m.ci.slices != m.gi.profile.Slices {
		profile = fmt.Sprintf("%dc.%s", m.ci.slices, profile)
	}
	return m.gi.parent.model.ProductName + " MIG " + profile, nvml.SUCCESS
}

// IsMigDeviceHandle implements nvml.Device.
func (m *fakeMIG) IsMigDeviceHandle() (bool, nvml.Return) {
	if ret := m.enter("nvmlDeviceIsMigDeviceHandle"); ret != nvml.SUCCESS {
		return false, ret
	}
	return true, nvml.SUCCESS
}

// GetGpuInstanceId implements nvml.Device.
func (m *fakeMIG) GetGpuInstanceId() (int, nvml.Return) {
	if ret := m.enter("nvmlDeviceGetGpuInstanceId"); ret != nvml.SUCCESS {
		return 0, ret
	}
	return m.gi.id, nvml.SUCCESS
}

// GetComputeInstanceId implements nvml.Device.
func (m *fakeMIG) GetComputeInstanceId() (int, nvml.Return) {
	if ret := m.enter("nvmlDeviceGetComputeInstanceId"); ret != nvml.SUCCESS {
		return 0, ret
	}
	return m.ci.id, nvml.SUCCESS
}

// GetDeviceHandleFromMigDeviceHandle implements nvml.Device.
func (m *fakeMIG) GetDeviceHandleFromMigDeviceHandle() (nvml.Device, nvml.Return) {
	if ret := m.enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle"); ret != nvml.SUCCESS {
		return nil, ret
	}
	return m.gi.parent, nvml.SUCCESS
}

// GetMemoryInfo implements nvml.Device. Compute instances share the memory
// of their GPU instance.
func (m *fakeMIG) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	if ret := m.enter("nvmlDeviceGetMemoryInfo"); ret != nvml.SUCCESS {
		return nvml.Memory{}, ret
	}
	total := m.gi.profile.MemoryMiB * 1024 * 1024
	return nvml.Memory{Total: total, Free: total}, nvml.SUCCESS
}

// GetAttributes implements nvml.Device.
func (m *fakeMIG) GetAttributes() (nvml.DeviceAttributes, nvml.Return) {
	if ret := m.enter("nvmlDeviceGetAttributes"); ret != nvml.SUCCESS {
		return nvml.DeviceAttributes{}, ret
	}
	p := m.gi.profile
	ci := p.ciInfo(m.ci.slices)
	return nvml.DeviceAttributes{
		MultiprocessorCount:       ci.MultiprocessorCount,
		SharedCopyEngineCount:     uint32(p.CopyEngines),
		SharedDecoderCount:        uint32(p.Decoders),
		SharedEncoderCount:        uint32(p.Encoders),
		SharedJpegCount:           uint32(p.JPEGEngines),
		SharedOfaCount:            uint32(p.OFAEngines),
		GpuInstanceSliceCount:     uint32(p.Slices),
		ComputeInstanceSliceCount: uint32(m.ci.slices),
		MemorySizeMB:              p.MemoryMiB,
	}, nvml.SUCCESS
}

// removeMIG drops the MIG device of ci from d's list; the caller holds
// nv.mu.
func (d *fakeDevice) removeMIG(ci *fakeCI) {
	d.migs = slices.DeleteFunc(d.migs, func(m *fakeMIG) bool { return m.ci == ci })
}
