package sim

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// The fake implements the NVML calls that discovery (ours and go-nvlib's)
// makes, as methods on types that embed go-nvml's moq types. The moq types
// only catch calls nobody implemented here, with a panic naming the method;
// their Func fields are not used because moq records every call, which
// would grow without bound in a long-running simulation.
//
// The fake is built once from a resolved node and never changes, so it is
// safe for concurrent use. Creating and destroying MIG devices will need a
// lock.

// fakeNVML implements nvml.Interface for one simulated node.
type fakeNVML struct {
	mock.Interface
	driverVersion string
	cudaVersion   int
	devices       []*fakeDevice
}

// newFakeNVML builds the fake NVML of a resolved node.
func newFakeNVML(n *Node) *fakeNVML {
	f := &fakeNVML{driverVersion: n.DriverVersion, cudaVersion: cudaVersionInt(n.CUDADriverVersion)}
	for i := range n.GPUs {
		g := &n.GPUs[i]
		m := models[g.Model]
		d := &fakeDevice{
			index: i, minor: *g.Minor, uuid: g.UUID, model: m, busID: g.PCIBusID,
			memoryBytes: g.MemoryMiB * 1024 * 1024, migEnabled: g.MIGEnabled,
		}
		for _, md := range g.MIGDevices {
			prof, _ := m.profile(md.Profile)
			gi := &fakeGI{
				parent: d, profile: prof, start: *md.PlacementStart,
				// GPU instance IDs follow the driver's numbering of the
				// memory-slice blocks as a binary tree: the whole GPU is 0,
				// halves 1-2, quarters 3-6, eighths 7-14 (nvidia-smi mig -lgi
				// shows 1g at start s as GI 7+s, 4g at 0 as GI 1, 3g at 4
				// as GI 2).
				id: m.MemorySlices/prof.PlacementSize - 1 + *md.PlacementStart/prof.PlacementSize,
			}
			// A GPU instance holds one compute instance spanning it or,
			// split, as many of ComputeSlices slices as fit, numbered
			// from 0 and placed side by side.
			c := md.ComputeSlices
			if c == 0 {
				c = prof.Slices
			}
			for k := 0; k < prof.Slices/c; k++ {
				ci := &fakeCI{gi: gi, id: k, slices: c, profile: prof.ciProfile(c)}
				uuid := md.UUID
				if k > 0 {
					uuid = ciUUID(n.Name, i, prof.Name, *md.PlacementStart, k)
				}
				gi.cis = append(gi.cis, ci)
				d.migs = append(d.migs, &fakeMIG{gi: gi, ci: ci, uuid: uuid})
			}
			d.gis = append(d.gis, gi)
		}
		f.devices = append(f.devices, d)
	}
	return f
}

// cudaVersionInt encodes "12.8" as NVML does: 12080.
func cudaVersionInt(v string) int {
	major, minor, _ := strings.Cut(v, ".")
	ma, _ := strconv.Atoi(major)
	mi, _ := strconv.Atoi(minor)
	return ma*1000 + mi*10
}

// Init implements nvml.Interface.
func (f *fakeNVML) Init() nvml.Return { return nvml.SUCCESS }

// InitWithFlags implements nvml.Interface.
func (f *fakeNVML) InitWithFlags(uint32) nvml.Return { return nvml.SUCCESS }

// Shutdown implements nvml.Interface.
func (f *fakeNVML) Shutdown() nvml.Return { return nvml.SUCCESS }

// Extensions implements nvml.Interface.
func (f *fakeNVML) Extensions() nvml.ExtendedInterface { return fakeExtensions{} }

// SystemGetDriverVersion implements nvml.Interface.
func (f *fakeNVML) SystemGetDriverVersion() (string, nvml.Return) {
	return f.driverVersion, nvml.SUCCESS
}

// SystemGetCudaDriverVersion implements nvml.Interface.
func (f *fakeNVML) SystemGetCudaDriverVersion() (int, nvml.Return) {
	return f.cudaVersion, nvml.SUCCESS
}

// DeviceGetCount implements nvml.Interface.
func (f *fakeNVML) DeviceGetCount() (int, nvml.Return) { return len(f.devices), nvml.SUCCESS }

// DeviceGetHandleByIndex implements nvml.Interface.
func (f *fakeNVML) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	if i < 0 || i >= len(f.devices) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return f.devices[i], nvml.SUCCESS
}

// DeviceGetHandleByUUID implements nvml.Interface.
func (f *fakeNVML) DeviceGetHandleByUUID(uuid string) (nvml.Device, nvml.Return) {
	for _, d := range f.devices {
		if d.uuid == uuid {
			return d, nvml.SUCCESS
		}
		for _, m := range d.migs {
			if m.uuid == uuid {
				return m, nvml.SUCCESS
			}
		}
	}
	return nil, nvml.ERROR_NOT_FOUND
}

// fakeExtensions reports every symbol as present.
type fakeExtensions struct{}

// LookupSymbol implements nvml.ExtendedInterface.
func (fakeExtensions) LookupSymbol(string) error { return nil }

// fakeDevice is a physical GPU.
type fakeDevice struct {
	mock.Device
	index, minor int
	uuid, busID  string
	model        *Model
	memoryBytes  uint64
	migEnabled   bool
	gis          []*fakeGI
	migs         []*fakeMIG
}

// GetIndex implements nvml.Device.
func (d *fakeDevice) GetIndex() (int, nvml.Return) { return d.index, nvml.SUCCESS }

// GetMinorNumber implements nvml.Device.
func (d *fakeDevice) GetMinorNumber() (int, nvml.Return) { return d.minor, nvml.SUCCESS }

// GetUUID implements nvml.Device.
func (d *fakeDevice) GetUUID() (string, nvml.Return) { return d.uuid, nvml.SUCCESS }

// GetName implements nvml.Device.
func (d *fakeDevice) GetName() (string, nvml.Return) { return d.model.ProductName, nvml.SUCCESS }

// GetBrand implements nvml.Device.
func (d *fakeDevice) GetBrand() (nvml.BrandType, nvml.Return) { return d.model.Brand, nvml.SUCCESS }

// GetArchitecture implements nvml.Device.
func (d *fakeDevice) GetArchitecture() (nvml.DeviceArchitecture, nvml.Return) {
	return d.model.Architecture, nvml.SUCCESS
}

// GetCudaComputeCapability implements nvml.Device.
func (d *fakeDevice) GetCudaComputeCapability() (int, int, nvml.Return) {
	return d.model.CCMajor, d.model.CCMinor, nvml.SUCCESS
}

// GetMemoryInfo implements nvml.Device.
func (d *fakeDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	return nvml.Memory{Total: d.memoryBytes, Free: d.memoryBytes}, nvml.SUCCESS
}

// GetPciInfo implements nvml.Device. NVML spells bus IDs with an 8-digit
// domain in upper case: "00000000:1B:00.0".
func (d *fakeDevice) GetPciInfo() (nvml.PciInfo, nvml.Return) {
	var domain, bus, dev, fn uint32
	if _, err := fmt.Sscanf(d.busID, "%x:%x:%x.%x", &domain, &bus, &dev, &fn); err != nil {
		return nvml.PciInfo{}, nvml.ERROR_UNKNOWN
	}
	info := nvml.PciInfo{Domain: domain, Bus: bus, Device: dev, PciDeviceId: d.model.PCIDeviceID}
	putCString(info.BusId[:], fmt.Sprintf("%08X:%02X:%02X.%X", domain, bus, dev, fn))
	putCString(info.BusIdLegacy[:], fmt.Sprintf("%04X:%02X:%02X.%X", domain, bus, dev, fn))
	return info, nvml.SUCCESS
}

func putCString(dst []int8, s string) {
	for i := 0; i < len(s) && i < len(dst)-1; i++ {
		dst[i] = int8(s[i])
	}
}

// IsMigDeviceHandle implements nvml.Device.
func (d *fakeDevice) IsMigDeviceHandle() (bool, nvml.Return) { return false, nvml.SUCCESS }

// GetMigMode implements nvml.Device.
func (d *fakeDevice) GetMigMode() (int, int, nvml.Return) {
	if len(d.model.MIGProfiles) == 0 {
		return 0, 0, nvml.ERROR_NOT_SUPPORTED
	}
	mode := nvml.DEVICE_MIG_DISABLE
	if d.migEnabled {
		mode = nvml.DEVICE_MIG_ENABLE
	}
	return mode, mode, nvml.SUCCESS
}

// GetMaxMigDeviceCount implements nvml.Device.
func (d *fakeDevice) GetMaxMigDeviceCount() (int, nvml.Return) {
	if len(d.model.MIGProfiles) == 0 {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	if !d.migEnabled {
		return 0, nvml.SUCCESS
	}
	n := 0
	for _, p := range d.model.MIGProfiles {
		n = max(n, p.Instances)
	}
	return n, nvml.SUCCESS
}

// GetMigDeviceHandleByIndex implements nvml.Device.
func (d *fakeDevice) GetMigDeviceHandleByIndex(i int) (nvml.Device, nvml.Return) {
	n, ret := d.GetMaxMigDeviceCount()
	switch {
	case ret != nvml.SUCCESS:
		return nil, ret
	case i < 0 || i >= n:
		return nil, nvml.ERROR_INVALID_ARGUMENT
	case i >= len(d.migs):
		return nil, nvml.ERROR_NOT_FOUND
	}
	return d.migs[i], nvml.SUCCESS
}

// GetGpuInstanceProfileInfo implements nvml.Device.
func (d *fakeDevice) GetGpuInstanceProfileInfo(profile int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	if len(d.model.MIGProfiles) == 0 {
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	if profile < 0 || profile >= nvml.GPU_INSTANCE_PROFILE_COUNT {
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
	}
	for i := range d.model.MIGProfiles {
		if p := &d.model.MIGProfiles[i]; p.GIProfile == profile {
			return p.giInfo(), nvml.SUCCESS
		}
	}
	return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
}

// GetGpuInstancePossiblePlacements implements nvml.Device.
func (d *fakeDevice) GetGpuInstancePossiblePlacements(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
	for _, p := range d.model.MIGProfiles {
		if uint32(p.ID) == info.Id {
			var out []nvml.GpuInstancePlacement
			for _, s := range p.PlacementStarts {
				out = append(out, nvml.GpuInstancePlacement{Start: uint32(s), Size: uint32(p.PlacementSize)})
			}
			return out, nvml.SUCCESS
		}
	}
	return nil, nvml.ERROR_INVALID_ARGUMENT
}

// GetGpuInstances implements nvml.Device.
func (d *fakeDevice) GetGpuInstances(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
	var out []nvml.GpuInstance
	for _, gi := range d.gis {
		if uint32(gi.profile.ID) == info.Id {
			out = append(out, gi)
		}
	}
	return out, nvml.SUCCESS
}

// GetGpuInstanceById implements nvml.Device.
func (d *fakeDevice) GetGpuInstanceById(id int) (nvml.GpuInstance, nvml.Return) {
	for _, gi := range d.gis {
		if gi.id == id {
			return gi, nvml.SUCCESS
		}
	}
	return nil, nvml.ERROR_NOT_FOUND
}

func (p *MIGProfile) giInfo() nvml.GpuInstanceProfileInfo {
	return nvml.GpuInstanceProfileInfo{
		Id:                  uint32(p.ID),
		SliceCount:          uint32(p.Slices),
		InstanceCount:       uint32(p.Instances),
		MultiprocessorCount: uint32(p.Multiprocessors),
		CopyEngineCount:     uint32(p.CopyEngines),
		DecoderCount:        uint32(p.Decoders),
		EncoderCount:        uint32(p.Encoders),
		JpegCount:           uint32(p.JPEGEngines),
		OfaCount:            uint32(p.OFAEngines),
		MemorySizeMB:        p.MemoryMiB,
	}
}

// ciInfo describes the compute instances of c slices in a GPU instance of
// profile p. Engines are shared within the GPU instance; multiprocessors
// are split evenly among its compute slices.
func (p *MIGProfile) ciInfo(c int) nvml.ComputeInstanceProfileInfo {
	return nvml.ComputeInstanceProfileInfo{
		Id:                    uint32(p.ciProfile(c)),
		SliceCount:            uint32(c),
		InstanceCount:         uint32(p.Slices / c),
		MultiprocessorCount:   uint32(p.Multiprocessors * c / p.Slices),
		SharedCopyEngineCount: uint32(p.CopyEngines),
		SharedDecoderCount:    uint32(p.Decoders),
		SharedEncoderCount:    uint32(p.Encoders),
		SharedJpegCount:       uint32(p.JPEGEngines),
		SharedOfaCount:        uint32(p.OFAEngines),
	}
}

// fakeGI is a GPU instance.
type fakeGI struct {
	mock.GpuInstance
	parent  *fakeDevice
	profile *MIGProfile
	id      int
	start   int
	cis     []*fakeCI
}

// GetInfo implements nvml.GpuInstance.
func (gi *fakeGI) GetInfo() (nvml.GpuInstanceInfo, nvml.Return) {
	return nvml.GpuInstanceInfo{
		Device:    gi.parent,
		Id:        uint32(gi.id),
		ProfileId: uint32(gi.profile.ID),
		Placement: nvml.GpuInstancePlacement{Start: uint32(gi.start), Size: uint32(gi.profile.PlacementSize)},
	}, nvml.SUCCESS
}

// GetComputeInstanceProfileInfo implements nvml.GpuInstance for the
// compute instance sizes the GPU instance allows (see
// [MIGProfile.computeSlices]).
func (gi *fakeGI) GetComputeInstanceProfileInfo(profile, engProfile int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
	if profile < 0 || profile >= nvml.COMPUTE_INSTANCE_PROFILE_COUNT ||
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
	for _, ci := range gi.cis {
		if ci.id == id {
			return ci, nvml.SUCCESS
		}
	}
	return nil, nvml.ERROR_NOT_FOUND
}

// fakeCI is a compute instance of slices compute slices, placed after the
// GPU instance's compute instances with lower IDs.
type fakeCI struct {
	mock.ComputeInstance
	gi      *fakeGI
	id      int
	slices  int
	profile int // NVML_COMPUTE_INSTANCE_PROFILE_*
}

// GetInfo implements nvml.ComputeInstance.
func (ci *fakeCI) GetInfo() (nvml.ComputeInstanceInfo, nvml.Return) {
	return nvml.ComputeInstanceInfo{
		Device:      ci.gi.parent,
		GpuInstance: ci.gi,
		Id:          uint32(ci.id),
		ProfileId:   uint32(ci.profile),
		Placement:   nvml.ComputeInstancePlacement{Start: uint32(ci.id * ci.slices), Size: uint32(ci.slices)},
	}, nvml.SUCCESS
}

// fakeMIG is the device handle of a MIG device: one compute instance.
type fakeMIG struct {
	mock.Device
	gi   *fakeGI
	ci   *fakeCI
	uuid string
}

// GetUUID implements nvml.Device.
func (m *fakeMIG) GetUUID() (string, nvml.Return) { return m.uuid, nvml.SUCCESS }

// GetName implements nvml.Device, as "<parent name> MIG <profile>", where
// the profile of a compute instance smaller than its GPU instance reads
// "<c>c.<GPU instance profile>".
func (m *fakeMIG) GetName() (string, nvml.Return) {
	profile := m.gi.profile.Name
	if m.ci.slices != m.gi.profile.Slices {
		profile = fmt.Sprintf("%dc.%s", m.ci.slices, profile)
	}
	return m.gi.parent.model.ProductName + " MIG " + profile, nvml.SUCCESS
}

// IsMigDeviceHandle implements nvml.Device.
func (m *fakeMIG) IsMigDeviceHandle() (bool, nvml.Return) { return true, nvml.SUCCESS }

// GetGpuInstanceId implements nvml.Device.
func (m *fakeMIG) GetGpuInstanceId() (int, nvml.Return) { return m.gi.id, nvml.SUCCESS }

// GetComputeInstanceId implements nvml.Device.
func (m *fakeMIG) GetComputeInstanceId() (int, nvml.Return) { return m.ci.id, nvml.SUCCESS }

// GetDeviceHandleFromMigDeviceHandle implements nvml.Device.
func (m *fakeMIG) GetDeviceHandleFromMigDeviceHandle() (nvml.Device, nvml.Return) {
	return m.gi.parent, nvml.SUCCESS
}

// GetMemoryInfo implements nvml.Device. Compute instances share the memory
// of their GPU instance.
func (m *fakeMIG) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	total := m.gi.profile.MemoryMiB * 1024 * 1024
	return nvml.Memory{Total: total, Free: total}, nvml.SUCCESS
}

// GetAttributes implements nvml.Device.
func (m *fakeMIG) GetAttributes() (nvml.DeviceAttributes, nvml.Return) {
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
