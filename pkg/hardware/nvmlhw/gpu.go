package nvmlhw

import (
	"errors"
	"fmt"

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
	// The MIG capability minors are read on first use, and only once per
	// Discover even when that fails: nodes without MIG devices need not
	// have /proc/driver/nvidia-caps at all.
	capsRead bool
	caps     MIGCapMinors
	capsErr  error
}

func newGPUReader(lib nvml.Interface, topo Topology, sys SystemInfo) *gpuReader {
	return &gpuReader{lib: lib, devlib: nvdev.New(lib), topo: topo, sys: sys}
}

func (g *gpuReader) migCapMinors() (MIGCapMinors, error) {
	if !g.capsRead {
		g.caps, g.capsErr = g.sys.MIGCapMinors()
		g.capsRead = true
	}
	return g.caps, g.capsErr
}

// gpuName names a GPU in problems: "GPU 3", or "GPU 3 (GPU-...)" once its
// UUID is known.
func gpuName(index int, uuid string) string {
	if uuid == "" {
		return fmt.Sprintf("GPU %d", index)
	}
	return fmt.Sprintf("GPU %d (%s)", index, uuid)
}

// read returns the GPU at NVML index i. ok is false when the GPU is left
// out: a device that is not a compute GPU (with no problem), or one that
// could not be read (with one problem saying why). problems also lists the
// MIG devices of a published GPU that were left out.
func (g *gpuReader) read(i int) (gpu hardware.GPU, ok bool, problems []hardware.Problem) {
	var uuid string
	fail := func(call string, err error) (hardware.GPU, bool, []hardware.Problem) {
		return hardware.GPU{}, false, []hardware.Problem{{
			Index: i, UUID: uuid, Err: fmt.Sprintf("%s: %s: %v", gpuName(i, uuid), call, err),
		}}
	}

	handle, ret := g.lib.DeviceGetHandleByIndex(i)
	if ret != nvml.SUCCESS {
		return fail("nvmlDeviceGetHandleByIndex", ret)
	}
	dev, err := g.devlib.NewDevice(handle)
	if err != nil {
		return fail("read device", err)
	}
	uuid, ret = dev.GetUUID()
	if ret != nvml.SUCCESS {
		uuid = ""
		return fail("nvmlDeviceGetUUID", ret)
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

	gpu = hardware.GPU{
		Index:                 i,
		Minor:                 minor,
		UUID:                  uuid,
		ProductName:           name,
		Brand:                 brand,
		Architecture:          arch,
		CUDAComputeCapability: cc,
		PCIBusID:              busID,
		PCIeRoot:              root,
		NUMANode:              numa,
		Fabric:                readFabric(dev),
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

	// v1, not nvmlDeviceGetMemoryInfo_v2: both report the same total, and
	// go-nvml binds v2 without a fallback, so calling it on a driver that
	// lacks the symbol would abort the process.
	var memErr error
	memory, ret := dev.GetMemoryInfo()
	switch {
	case ret == nvml.SUCCESS:
		gpu.MemoryBytes = memory.Total
	case gpu.MIGEnabled:
		// In MIG mode NVML reports the GPU as a whole only to privileged
		// callers (ERROR_NO_PERMISSION otherwise). Its MIG devices carry
		// their own memory and are what gets published; the full GPU's
		// memory is not needed except to name their profiles.
		memErr = fmt.Errorf("nvmlDeviceGetMemoryInfo: %w", ret)
	default:
		return fail("nvmlDeviceGetMemoryInfo", ret)
	}

	if !gpu.MIGCapable {
		return gpu, true, nil
	}
	profiles, err := giProfiles(dev)
	if err != nil {
		return fail("MIG profiles", err)
	}
	// What could be created stays unknown to unprivileged callers, as
	// nvml.h documents: placements need privileges, and the profile names
	// derive from the GPU's total memory, which NVML hides from them in
	// MIG mode. The GPU itself is still published.
	if memErr == nil {
		gpu.MIGProfiles, gpu.MIGMemorySlices, err = migProfiles(g.devlib, dev, profiles, gpu.MemoryBytes)
		switch {
		case errors.Is(err, nvml.ERROR_NO_PERMISSION):
			gpu.MIGProfiles, gpu.MIGMemorySlices = nil, 0
		case err != nil:
			return fail("MIG profiles", err)
		}
	}
	if gpu.MIGEnabled {
		migs, problems, err := g.readMIGDevices(dev, gpu, profiles, memErr)
		if err != nil {
			return fail("MIG devices", err)
		}
		gpu.MIGDevices = migs
		return gpu, true, problems
	}
	return gpu, true, nil
}

// readFabric returns the GPU's NVLink fabric membership, nil when the GPU
// or its driver has none. A failed query does not leave the GPU out, since
// only ComputeDomains need the fabric: the state is then Unknown, with why.
//
// It calls nvmlDeviceGetGpuFabricInfo, as NVIDIA's driver does: the
// versioned nvmlDeviceGetGpuFabricInfoV is bound in go-nvml to a concrete
// handler type that no fake can serve, and adds only health fields.
func readFabric(dev nvml.Device) *hardware.Fabric {
	info, ret := dev.GetGpuFabricInfo() //nolint:staticcheck // see above
	switch {
	case ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_FUNCTION_NOT_FOUND:
		return nil
	case ret != nvml.SUCCESS:
		return &hardware.Fabric{State: hardware.FabricUnknown, Status: fmt.Sprintf("nvmlDeviceGetGpuFabricInfo: %v", ret)}
	}
	f := &hardware.Fabric{CliqueID: info.CliqueId}
	switch info.State {
	case nvml.GPU_FABRIC_STATE_NOT_SUPPORTED:
		return nil
	case nvml.GPU_FABRIC_STATE_NOT_STARTED:
		f.State = hardware.FabricNotStarted
	case nvml.GPU_FABRIC_STATE_IN_PROGRESS:
		f.State = hardware.FabricInProgress
	case nvml.GPU_FABRIC_STATE_COMPLETED:
		f.State = hardware.FabricCompleted
		if r := nvml.Return(info.Status); r != nvml.SUCCESS {
			f.Status = r.Error()
		}
	default:
		f.State, f.Status = hardware.FabricUnknown, fmt.Sprintf("unknown fabric state %d", info.State)
	}
	if info.ClusterUuid != [16]uint8{} {
		u := info.ClusterUuid
		f.ClusterUUID = fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
	}
	return f
}
