package sim

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// fakeDevice is a physical GPU.
type fakeDevice struct {
	mock.Device
	nv          *fakeNVML
	index       int
	uuid, busID string
	model       *Model
	memoryBytes uint64
	// fabric is the node's; nil: no NVLink fabric.
	fabric *Fabric
	// unanswered are the NVML functions the GPU answers with an error
	// every time: the resolved GPU's nvmlErrors.
	unanswered map[string]nvml.Return

	// Guarded by nv.mu.
	minor                  int
	migEnabled, migPending bool // current and pending MIG mode
	gis                    []*fakeGI
	migs                   []*fakeMIG
}

// GetGpuFabricInfo implements nvml.Device: the node's fabric, or
// ERROR_NOT_SUPPORTED as a GPU without one answers. A registration that
// completes after a delay reports Completed once the delay has passed
// since the fake was built.
func (d *fakeDevice) GetGpuFabricInfo() (nvml.GpuFabricInfo, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetGpuFabricInfo"); ret != nvml.SUCCESS {
		return nvml.GpuFabricInfo{}, ret
	}
	if d.fabric == nil {
		return nvml.GpuFabricInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	info := nvml.GpuFabricInfo{CliqueId: d.fabric.CliqueID, Status: uint32(nvml.SUCCESS)}
	state := hardware.FabricState(d.fabric.State)
	if after := d.fabric.CompletesAfter; after != nil && time.Since(d.nv.booted) >= after.Duration {
		state = hardware.FabricCompleted
	}
	switch state {
	case hardware.FabricNotStarted:
		info.State = nvml.GPU_FABRIC_STATE_NOT_STARTED
	case hardware.FabricInProgress:
		info.State = nvml.GPU_FABRIC_STATE_IN_PROGRESS
	default:
		info.State = nvml.GPU_FABRIC_STATE_COMPLETED
	}
	if d.fabric.Status != "" {
		info.Status = uint32(nvml.ERROR_UNKNOWN)
	}
	hex := strings.ReplaceAll(d.fabric.ClusterUUID, "-", "")
	for i := range info.ClusterUuid {
		b, _ := strconv.ParseUint(hex[2*i:2*i+2], 16, 8) // validated as a UUID
		info.ClusterUuid[i] = uint8(b)
	}
	return info, nvml.SUCCESS
}

// GetIndex implements nvml.Device.
func (d *fakeDevice) GetIndex() (int, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetIndex"); ret != nvml.SUCCESS {
		return 0, ret
	}
	return d.index, nvml.SUCCESS
}

// GetMinorNumber implements nvml.Device.
func (d *fakeDevice) GetMinorNumber() (int, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetMinorNumber"); ret != nvml.SUCCESS {
		return 0, ret
	}
	defer d.nv.lock()()
	return d.minor, nvml.SUCCESS
}

// GetUUID implements nvml.Device.
func (d *fakeDevice) GetUUID() (string, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetUUID"); ret != nvml.SUCCESS {
		return "", ret
	}
	return d.uuid, nvml.SUCCESS
}

// GetName implements nvml.Device.
func (d *fakeDevice) GetName() (string, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetName"); ret != nvml.SUCCESS {
		return "", ret
	}
	return d.model.ProductName, nvml.SUCCESS
}

// GetBrand implements nvml.Device.
func (d *fakeDevice) GetBrand() (nvml.BrandType, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetBrand"); ret != nvml.SUCCESS {
		return 0, ret
	}
	return d.model.Brand, nvml.SUCCESS
}

// GetArchitecture implements nvml.Device.
func (d *fakeDevice) GetArchitecture() (nvml.DeviceArchitecture, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetArchitecture"); ret != nvml.SUCCESS {
		return 0, ret
	}
	return d.model.Architecture, nvml.SUCCESS
}

// GetCudaComputeCapability implements nvml.Device.
func (d *fakeDevice) GetCudaComputeCapability() (int, int, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetCudaComputeCapability"); ret != nvml.SUCCESS {
		return 0, 0, ret
	}
	return d.model.CCMajor, d.model.CCMinor, nvml.SUCCESS
}

// GetMemoryInfo implements nvml.Device.
func (d *fakeDevice) GetMemoryInfo() (nvml.Memory, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetMemoryInfo"); ret != nvml.SUCCESS {
		return nvml.Memory{}, ret
	}
	return nvml.Memory{Total: d.memoryBytes, Free: d.memoryBytes}, nvml.SUCCESS
}

// GetPciInfo implements nvml.Device. NVML spells bus IDs with an 8-digit
// domain in upper case: "00000000:1B:00.0".
func (d *fakeDevice) GetPciInfo() (nvml.PciInfo, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetPciInfo"); ret != nvml.SUCCESS {
		return nvml.PciInfo{}, ret
	}
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
func (d *fakeDevice) IsMigDeviceHandle() (bool, nvml.Return) {
	if ret := d.hit("nvmlDeviceIsMigDeviceHandle"); ret != nvml.SUCCESS {
		return false, ret
	}
	return false, nvml.SUCCESS
}

// migCapable reports whether the GPU supports MIG at all.
func (d *fakeDevice) migCapable() bool { return len(d.model.MIGProfiles) > 0 }

// GetMigMode implements nvml.Device: the current and the pending mode.
func (d *fakeDevice) GetMigMode() (int, int, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetMigMode"); ret != nvml.SUCCESS {
		return 0, 0, ret
	}
	if !d.migCapable() {
		return 0, 0, nvml.ERROR_NOT_SUPPORTED
	}
	defer d.nv.lock()()
	return migMode(d.migEnabled), migMode(d.migPending), nvml.SUCCESS
}

func migMode(enabled bool) int {
	if enabled {
		return nvml.DEVICE_MIG_ENABLE
	}
	return nvml.DEVICE_MIG_DISABLE
}

// GetMaxMigDeviceCount implements nvml.Device.
func (d *fakeDevice) GetMaxMigDeviceCount() (int, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetMaxMigDeviceCount"); ret != nvml.SUCCESS {
		return 0, ret
	}
	defer d.nv.lock()()
	return d.maxMIGDevices()
}

// maxMIGDevices answers GetMaxMigDeviceCount; the caller holds nv.mu.
func (d *fakeDevice) maxMIGDevices() (int, nvml.Return) {
	if !d.migCapable() {
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
	if ret := d.hit("nvmlDeviceGetMigDeviceHandleByIndex"); ret != nvml.SUCCESS {
		return nil, ret
	}
	defer d.nv.lock()()
	n, ret := d.maxMIGDevices()
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

// GetGpuInstanceProfileInfo implements nvml.Device. Like NVML it answers
// with MIG mode off too.
func (d *fakeDevice) GetGpuInstanceProfileInfo(profile int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetGpuInstanceProfileInfo"); ret != nvml.SUCCESS {
		return nvml.GpuInstanceProfileInfo{}, ret
	}
	if !d.migCapable() {
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

// profileOf returns the model's profile that info names, by its ID.
func (d *fakeDevice) profileOf(info *nvml.GpuInstanceProfileInfo) (*MIGProfile, bool) {
	if info == nil {
		return nil, false
	}
	for i := range d.model.MIGProfiles {
		if p := &d.model.MIGProfiles[i]; uint32(p.ID) == info.Id {
			return p, true
		}
	}
	return nil, false
}

// GetGpuInstancePossiblePlacements implements nvml.Device. Like NVML it
// answers with MIG mode off too.
func (d *fakeDevice) GetGpuInstancePossiblePlacements(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetGpuInstancePossiblePlacements"); ret != nvml.SUCCESS {
		return nil, ret
	}
	if !d.migCapable() {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	p, ok := d.profileOf(info)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	out := make([]nvml.GpuInstancePlacement, 0, len(p.PlacementStarts))
	for _, s := range p.PlacementStarts {
		out = append(out, nvml.GpuInstancePlacement{Start: uint32(s), Size: uint32(p.PlacementSize)})
	}
	return out, nvml.SUCCESS
}

// GetGpuInstances implements nvml.Device.
func (d *fakeDevice) GetGpuInstances(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetGpuInstances"); ret != nvml.SUCCESS {
		return nil, ret
	}
	defer d.nv.lock()()
	if !d.migCapable() || !d.migEnabled {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	p, ok := d.profileOf(info)
	if !ok {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	var out []nvml.GpuInstance
	for _, gi := range d.gis {
		if gi.profile == p {
			out = append(out, gi)
		}
	}
	return out, nvml.SUCCESS
}

// GetGpuInstanceById implements nvml.Device.
func (d *fakeDevice) GetGpuInstanceById(id int) (nvml.GpuInstance, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetGpuInstanceById"); ret != nvml.SUCCESS {
		return nil, ret
	}
	defer d.nv.lock()()
	if !d.migCapable() || !d.migEnabled {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
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
