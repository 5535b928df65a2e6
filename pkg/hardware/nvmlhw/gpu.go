package nvmlhw

import (
	"cmp"
	"fmt"
	"slices"

	nvdev "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// skippedNames are devices NVML lists that are not compute GPUs: the
// display adapter of DGX Station. go-nvlib skips the same names.
var skippedNames = map[string]bool{
	"DGX Display":        true,
	"NVIDIA DGX Display": true,
}

// gpuReader reads the GPUs of one Discover call.
type gpuReader struct {
	lib    nvml.Interface
	devlib nvdev.Interface
	topo   Topology
	sys    SystemInfo
	// caps is read on first use: nodes without MIG devices need not have
	// /proc/driver/nvidia-caps at all.
	caps MIGCapMinors
}

func newGPUReader(lib nvml.Interface, topo Topology, sys SystemInfo) *gpuReader {
	return &gpuReader{lib: lib, devlib: nvdev.New(lib), topo: topo, sys: sys}
}

func (g *gpuReader) migCapMinors() (MIGCapMinors, error) {
	if g.caps == nil {
		caps, err := g.sys.MIGCapMinors()
		if err != nil {
			return nil, err
		}
		g.caps = caps
	}
	return g.caps, nil
}

// read returns the GPU at NVML index i, and false for devices that are not
// published.
func (g *gpuReader) read(i int) (hardware.GPU, bool, error) {
	handle, ret := g.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return hardware.GPU{}, false, fmt.Errorf("GPU %d: nvmlDeviceGetHandleByIndex: %w", i, ret)
	}
	dev, err := g.devlib.NewDevice(handle)
	if err != nil {
		return hardware.GPU{}, false, fmt.Errorf("GPU %d: %w", i, err)
	}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return hardware.GPU{}, false, fmt.Errorf("GPU %d: nvmlDeviceGetUUID: %w", i, ret)
	}
	// From here on errors name the GPU by index and UUID.
	fail := func(call string, err error) (hardware.GPU, bool, error) {
		return hardware.GPU{}, false, fmt.Errorf("GPU %d (%s): %s: %w", i, uuid, call, err)
	}

	name, ret := dev.GetName()
	if ret != nvml.SUCCESS {
		return fail("nvmlDeviceGetName", ret)
	}
	if skippedNames[name] {
		return hardware.GPU{}, false, nil
	}
	minor, ret := dev.GetMinorNumber()
	if ret != nvml.SUCCESS {
		return fail("nvmlDeviceGetMinorNumber", ret)
	}
	brand, err := dev.GetBrandAsString()
	if err != nil {
		return fail("brand", err)
	}
	arch, err := dev.GetArchitectureAsString()
	if err != nil {
		return fail("architecture", err)
	}
	cc, err := dev.GetCudaComputeCapabilityAsString()
	if err != nil {
		return fail("CUDA compute capability", err)
	}
	memory, ret := dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return fail("nvmlDeviceGetMemoryInfo", ret)
	}
	// go-nvlib lower-cases NVML's "00000000:1B:00.0" and cuts the domain
	// to four digits: "0000:1b:00.0".
	busID, err := dev.GetPCIBusID()
	if err != nil {
		return fail("PCI bus ID", err)
	}
	root, err := g.topo.PCIeRoot(busID)
	if err != nil {
		return fail("topology", err)
	}
	numa, err := g.topo.NUMANode(busID)
	if err != nil {
		return fail("topology", err)
	}

	gpu := hardware.GPU{
		Index:                 i,
		Minor:                 minor,
		UUID:                  uuid,
		ProductName:           name,
		Brand:                 brand,
		Architecture:          arch,
		CUDAComputeCapability: cc,
		MemoryBytes:           memory.Total,
		PCIBusID:              busID,
		PCIeRoot:              root,
		NUMANode:              numa,
	}

	current, _, ret := dev.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		gpu.MIGCapable = true
		gpu.MIGEnabled = current == nvml.DEVICE_MIG_ENABLE
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		return fail("nvmlDeviceGetMigMode", ret)
	}
	if gpu.MIGEnabled {
		migs, err := g.readMIGDevices(dev, gpu)
		if err != nil {
			return fail("MIG devices", err)
		}
		gpu.MIGDevices = migs
	}
	return gpu, true, nil
}

// giProfile is one GPU instance profile a GPU supports.
type giProfile struct {
	index int // NVML_GPU_INSTANCE_PROFILE_*
	info  nvml.GpuInstanceProfileInfo
}

// giProfiles returns the GPU's instance profiles keyed by their profile ID,
// the number GpuInstanceInfo.ProfileId refers to.
func giProfiles(dev nvml.Device) (map[uint32]giProfile, error) {
	profiles := map[uint32]giProfile{}
	for i := 0; i < nvml.GPU_INSTANCE_PROFILE_COUNT; i++ {
		info, ret := dev.GetGpuInstanceProfileInfo(i)
		switch ret {
		case nvml.SUCCESS:
			profiles[info.Id] = giProfile{index: i, info: info}
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT:
		default:
			return nil, fmt.Errorf("nvmlDeviceGetGpuInstanceProfileInfo(%d): %w", i, ret)
		}
	}
	return profiles, nil
}

// ciProfileOf finds the NVML profile and engine profile indices of the
// compute instance profile with ID id in gi.
func ciProfileOf(gi nvml.GpuInstance, id uint32) (profile, engProfile int, err error) {
	for p := 0; p < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; p++ {
		for e := 0; e < nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_COUNT; e++ {
			info, ret := gi.GetComputeInstanceProfileInfo(p, e)
			switch ret {
			case nvml.SUCCESS:
				if info.Id == id {
					return p, e, nil
				}
			case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT:
			default:
				return 0, 0, fmt.Errorf("nvmlGpuInstanceGetComputeInstanceProfileInfo(%d, %d): %w", p, e, ret)
			}
		}
	}
	return 0, 0, fmt.Errorf("no compute instance profile has ID %d", id)
}

// readMIGDevices returns the MIG devices that exist on a MIG-enabled GPU,
// ordered by (GIProfileID, PlacementStart).
func (g *gpuReader) readMIGDevices(dev nvdev.Device, gpu hardware.GPU) ([]hardware.MIGDevice, error) {
	profiles, err := giProfiles(dev)
	if err != nil {
		return nil, err
	}
	maxCount, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvmlDeviceGetMaxMigDeviceCount: %w", ret)
	}
	var migs []hardware.MIGDevice
	for j := 0; j < maxCount; j++ {
		handle, ret := dev.GetMigDeviceHandleByIndex(j)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_FOUND, nvml.ERROR_INVALID_ARGUMENT:
			continue // no MIG device in this slot
		default:
			return nil, fmt.Errorf("nvmlDeviceGetMigDeviceHandleByIndex(%d): %w", j, ret)
		}
		mig, err := g.readMIGDevice(dev, gpu, profiles, handle)
		if err != nil {
			return nil, fmt.Errorf("MIG device %d: %w", j, err)
		}
		migs = append(migs, mig)
	}
	slices.SortFunc(migs, func(a, b hardware.MIGDevice) int {
		return cmp.Or(cmp.Compare(a.GIProfileID, b.GIProfileID), cmp.Compare(a.PlacementStart, b.PlacementStart))
	})
	return migs, nil
}

func (g *gpuReader) readMIGDevice(parent nvdev.Device, gpu hardware.GPU, profiles map[uint32]giProfile, handle nvml.Device) (hardware.MIGDevice, error) {
	uuid, ret := handle.GetUUID()
	if ret != nvml.SUCCESS {
		return hardware.MIGDevice{}, fmt.Errorf("nvmlDeviceGetUUID: %w", ret)
	}
	fail := func(call string, err error) (hardware.MIGDevice, error) {
		return hardware.MIGDevice{}, fmt.Errorf("%s: %s: %w", uuid, call, err)
	}
	giID, ret := handle.GetGpuInstanceId()
	if ret != nvml.SUCCESS {
		return fail("nvmlDeviceGetGpuInstanceId", ret)
	}
	ciID, ret := handle.GetComputeInstanceId()
	if ret != nvml.SUCCESS {
		return fail("nvmlDeviceGetComputeInstanceId", ret)
	}
	gi, ret := parent.GetGpuInstanceById(giID)
	if ret != nvml.SUCCESS {
		return fail(fmt.Sprintf("nvmlDeviceGetGpuInstanceById(%d)", giID), ret)
	}
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return fail(fmt.Sprintf("nvmlGpuInstanceGetInfo(GI %d)", giID), ret)
	}
	ci, ret := gi.GetComputeInstanceById(ciID)
	if ret != nvml.SUCCESS {
		return fail(fmt.Sprintf("nvmlGpuInstanceGetComputeInstanceById(GI %d, CI %d)", giID, ciID), ret)
	}
	ciInfo, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return fail(fmt.Sprintf("nvmlComputeInstanceGetInfo(GI %d, CI %d)", giID, ciID), ret)
	}
	profile, ok := profiles[giInfo.ProfileId]
	if !ok {
		return fail("GPU instance profile", fmt.Errorf("GI %d has profile ID %d, which the GPU does not list", giID, giInfo.ProfileId))
	}
	ciProfile, ciEngProfile, err := ciProfileOf(gi, ciInfo.ProfileId)
	if err != nil {
		return fail(fmt.Sprintf("compute instance profile of GI %d, CI %d", giID, ciID), err)
	}
	// go-nvlib builds the name nvidia-smi shows ("1g.10gb", "1g.10gb+me",
	// "1c.2g.20gb" for a compute instance smaller than its GPU instance).
	name, err := g.devlib.NewMigProfile(profile.index, ciProfile, ciEngProfile, profile.info.MemorySizeMB, gpu.MemoryBytes)
	if err != nil {
		return fail("MIG profile name", err)
	}
	caps, err := g.migCapMinors()
	if err != nil {
		return hardware.MIGDevice{}, err
	}
	giCap, ok := caps.GI(gpu.Minor, giID)
	if !ok {
		return fail("MIG capability minors", fmt.Errorf("no entry gpu%d/gi%d/access", gpu.Minor, giID))
	}
	ciCap, ok := caps.CI(gpu.Minor, giID, ciID)
	if !ok {
		return fail("MIG capability minors", fmt.Errorf("no entry gpu%d/gi%d/ci%d/access", gpu.Minor, giID, ciID))
	}

	info := profile.info
	return hardware.MIGDevice{
		UUID:            uuid,
		Profile:         name.String(),
		GIProfileID:     profile.index,
		ProfileID:       int(info.Id),
		CIProfileID:     ciProfile,
		CIEngProfileID:  ciEngProfile,
		GIID:            giID,
		CIID:            ciID,
		PlacementStart:  int(giInfo.Placement.Start),
		PlacementSize:   int(giInfo.Placement.Size),
		MemoryBytes:     info.MemorySizeMB * 1024 * 1024, // NVML's "MB" is MiB (nvml.h)
		Multiprocessors: int(info.MultiprocessorCount),
		CopyEngines:     int(info.CopyEngineCount),
		Decoders:        int(info.DecoderCount),
		Encoders:        int(info.EncoderCount),
		JPEGEngines:     int(info.JpegCount),
		OFAEngines:      int(info.OfaCount),
		GICapMinor:      giCap,
		CICapMinor:      ciCap,
	}, nil
}
