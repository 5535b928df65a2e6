package nvmlhw

import (
	"errors"
	"fmt"
	"strconv"

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
// out: a device that is not a compute GPU (with no problem), or one whose
// identity (handle, UUID, name, minor) could not be read or that answers
// any query with ERROR_GPU_IS_LOST (with one problem saying why). Any other
// property that cannot be read is left empty and listed in the GPU's
// Unread, and the GPU is published without it. problems also lists the
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

	gpu = hardware.GPU{Index: i, Minor: minor, UUID: uuid, ProductName: name}
	// The rest describes the GPU without identifying it. NVML leaves some
	// of it unanswered on some systems (Rubin, GB10's unified memory, VMs
	// without a PCIe root), where NVIDIA's driver drops the GPU or the
	// node; the GPU is published without what is unknown instead. A GPU
	// that fell off the bus (ERROR_GPU_IS_LOST) is another matter: it
	// answers nothing more, so it is left out as before, and a running
	// plugin keeps publishing what it had of it, tainted (see package
	// devicehealth), rather than a husk without its MIG devices.
	var lost *queryError
	unread := func(p hardware.Property, query string, err error) {
		var q *queryError
		if errors.As(err, &q) {
			query, err = q.query, q.err
		}
		if errors.Is(err, nvml.ERROR_GPU_IS_LOST) && lost == nil {
			lost = &queryError{query: query, err: err}
		}
		gpu.Unread = append(gpu.Unread, hardware.Unread{Property: p, Query: query, Err: err.Error()})
	}
	done := func(problems []hardware.Problem) (hardware.GPU, bool, []hardware.Problem) {
		if lost != nil {
			return fail(lost.query, lost.err)
		}
		return gpu, true, problems
	}
	if gpu.Brand, err = g.brand(dev); err != nil {
		unread(hardware.PropertyBrand, "nvmlDeviceGetBrand", err)
	}
	if gpu.Architecture, err = g.architecture(dev); err != nil {
		unread(hardware.PropertyArchitecture, "nvmlDeviceGetArchitecture", err)
	}
	if major, minor, ret := dev.GetCudaComputeCapability(); ret == nvml.SUCCESS {
		gpu.CUDAComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	} else {
		unread(hardware.PropertyCUDAComputeCapability, "nvmlDeviceGetCudaComputeCapability", ret)
	}
	// go-nvlib lower-cases NVML's "00000000:1B:00.0" and cuts the domain
	// to four digits: "0000:1b:00.0". Without it the topology is unknown
	// too, and not asked for.
	if gpu.PCIBusID, err = dev.GetPCIBusID(); err != nil {
		unread(hardware.PropertyPCIBusID, "nvmlDeviceGetPciInfo", nvmlError(err))
	} else {
		if gpu.PCIeRoot, err = g.topo.PCIeRoot(gpu.PCIBusID); err != nil {
			unread(hardware.PropertyPCIeRoot, "PCIe root of "+gpu.PCIBusID, err)
		}
		if gpu.NUMANode, err = g.topo.NUMANode(gpu.PCIBusID); err != nil {
			unread(hardware.PropertyNUMANode, "NUMA node of "+gpu.PCIBusID, err)
		}
	}
	gpu.Fabric = readFabric(dev)

	// A GPU whose MIG mode is unknown is published as one without MIG: no
	// MIG device or placement is offered on it, nor a mode switch.
	current, _, ret := dev.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		gpu.MIGCapable = true
		gpu.MIGEnabled = current == nvml.DEVICE_MIG_ENABLE
	case nvml.ERROR_NOT_SUPPORTED:
	default:
		unread(hardware.PropertyMIGMode, "nvmlDeviceGetMigMode", ret)
	}

	// v1, not nvmlDeviceGetMemoryInfo_v2: both report the same total, and
	// go-nvml binds v2 without a fallback, so calling it on a driver that
	// lacks the symbol would abort the process.
	var memErr error
	memory, ret := dev.GetMemoryInfo()
	switch {
	case ret == nvml.SUCCESS:
		gpu.MemoryBytes = memory.Total
	case gpu.MIGEnabled && ret == nvml.ERROR_NO_PERMISSION:
		// In MIG mode NVML reports the GPU as a whole only to privileged
		// callers. Its MIG devices carry their own memory and are what
		// gets published; the full GPU's memory is not needed except to
		// name their profiles, so this is expected, not unread.
		memErr = fmt.Errorf("nvmlDeviceGetMemoryInfo: %w", ret)
	default:
		memErr = fmt.Errorf("nvmlDeviceGetMemoryInfo: %w", ret)
		unread(hardware.PropertyMemory, "nvmlDeviceGetMemoryInfo", ret)
	}

	if !gpu.MIGCapable {
		return done(nil)
	}
	profiles, err := giProfiles(dev)
	if err != nil {
		unread(hardware.PropertyMIGProfiles, "nvmlDeviceGetGpuInstanceProfileInfo", err)
		// MIG devices are told apart by their profiles.
		if gpu.MIGEnabled {
			unread(hardware.PropertyMIGDevices, "nvmlDeviceGetGpuInstanceProfileInfo", err)
		}
		return done(nil)
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
			gpu.MIGProfiles, gpu.MIGMemorySlices = nil, 0
			unread(hardware.PropertyMIGProfiles, "MIG profiles", err)
		}
	}
	if gpu.MIGEnabled {
		migs, problems, err := g.readMIGDevices(dev, gpu, profiles, memErr)
		if err != nil {
			// Where the MIG devices lie is unknown, so a placement offered
			// could collide with one of them.
			gpu.MIGProfiles, gpu.MIGMemorySlices = nil, 0
			unread(hardware.PropertyMIGDevices, "MIG devices", err)
			return done(nil)
		}
		gpu.MIGDevices = migs
		return done(problems)
	}
	return done(nil)
}

// queryError is a failed query: what was asked (an NVML function as nvml.h
// names it, with its argument where that matters, or a file) and why it
// failed. Discovery reports it as an unread property's query and error.
type queryError struct {
	query string
	err   error
}

func (e *queryError) Error() string { return e.query + ": " + e.err.Error() }
func (e *queryError) Unwrap() error { return e.err }

// queryFailed returns a [queryError].
func queryFailed(query string, err error) error { return &queryError{query: query, err: err} }

// nvmlError is the NVML error err wraps (go-nvlib wraps them in its own
// words), or err.
func nvmlError(err error) error {
	var ret nvml.Return
	if errors.As(err, &ret) {
		return ret
	}
	return err
}

// answered is a device whose brand and architecture are what NVML already
// answered, so that go-nvlib names them without asking NVML again.
type answered struct {
	nvml.Device
	brand nvml.BrandType
	arch  nvml.DeviceArchitecture
}

// GetBrand implements nvml.Device.
func (a answered) GetBrand() (nvml.BrandType, nvml.Return) { return a.brand, nvml.SUCCESS }

// GetArchitecture implements nvml.Device.
func (a answered) GetArchitecture() (nvml.DeviceArchitecture, nvml.Return) {
	return a.arch, nvml.SUCCESS
}

// brand returns the GPU's brand as go-nvlib, and so NVIDIA's driver, names
// it. go-nvlib fails on a brand newer than itself; that one is published
// as NVML's number rather than dropped, since NVML did answer. The error
// is NVML's.
func (g *gpuReader) brand(dev nvml.Device) (string, error) {
	brand, ret := dev.GetBrand()
	if ret != nvml.SUCCESS {
		return "", ret
	}
	if named, err := g.devlib.NewDevice(answered{Device: dev, brand: brand}); err == nil {
		if s, err := named.GetBrandAsString(); err == nil {
			return s, nil
		}
	}
	return strconv.FormatUint(uint64(brand), 10), nil
}

// architecture returns the GPU's architecture as go-nvlib, and so NVIDIA's
// driver, names it. go-nvlib fails on an architecture newer than itself
// (a driver that knows Rubin's successor under an older go-nvlib); that one
// is published as NVML's number rather than dropped, since NVML did
// answer. The error is NVML's.
func (g *gpuReader) architecture(dev nvml.Device) (string, error) {
	arch, ret := dev.GetArchitecture()
	if ret != nvml.SUCCESS {
		return "", ret
	}
	if named, err := g.devlib.NewDevice(answered{Device: dev, arch: arch}); err == nil {
		if s, err := named.GetArchitectureAsString(); err == nil {
			return s, nil
		}
	}
	return strconv.FormatUint(uint64(arch), 10), nil
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
