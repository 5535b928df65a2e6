package devicemodel

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// KindVFIO is a GPU handed whole to a container through VFIO (a virtual
// machine, or a workload that brings its own driver).
const KindVFIO Kind = "vfio"

// Attributes of VFIO devices besides the GPU's own.
const (
	AttrVendorID   resourceapi.QualifiedName = "vendorID"
	AttrDeviceID   resourceapi.QualifiedName = "deviceID"
	AttrIOMMUGroup resourceapi.QualifiedName = "iommuGroup"
)

// VFIOName is the device name of a GPU offered for passthrough, as NVIDIA's
// driver names it: gpu-vfio-<minor>.
func VFIOName(minor int) string { return fmt.Sprintf("gpu-vfio-%d", minor) }

// VFIOInfo is what a GPU's PCI function says about passthrough.
type VFIOInfo struct {
	// VendorID and DeviceID are the PCI IDs, e.g. "0x10de" and "0x2330".
	VendorID, DeviceID string
	// IOMMUGroup is the function's IOMMU group.
	IOMMUGroup int
}

// VFIOMode is how GPUs are offered for passthrough.
type VFIOMode string

const (
	// VFIOBeside offers each GPU both as CUDA devices and as a VFIO device,
	// kept apart by the GPU's shared counters (KEP-4815): the VFIO device
	// consumes all of them, like the full GPU, so the scheduler never
	// allocates a GPU both ways. It needs partitionable devices.
	VFIOBeside VFIOMode = "beside"
	// VFIOOnly offers each GPU it applies to only as a VFIO device, with
	// no counters: for API servers without partitionable devices.
	VFIOOnly VFIOMode = "only"
)

// VFIOInfoFunc returns the passthrough facts of a GPU, and false for a GPU
// that cannot be passed through (no IOMMU group) or is not to be.
type VFIOInfoFunc func(gpu hardware.GPU) (VFIOInfo, bool)

// WithVFIO offers GPUs for passthrough as [VFIOName] devices of type
// "vfio", as mode says; info says which GPUs and their PCI facts. A GPU
// with MIG mode on is offered for passthrough only where it is also
// offered whole (MIG mode switching). A GPU whose PCI bus ID is unknown is
// not offered, nor, beside CUDA devices, one whose memory is unknown: the
// counters that keep the two apart hold the GPU's memory.
func WithVFIO(mode VFIOMode, info VFIOInfoFunc) Option {
	return func(o *buildOptions) { o.vfioMode, o.vfioInfo = mode, info }
}

// vfioDevice is the published VFIO device of gpu.
func vfioDevice(gpu *hardware.GPU, gpuAttrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, info VFIOInfo) resourceapi.Device {
	return resourceapi.Device{
		Name: VFIOName(gpu.Minor),
		Attributes: withAttrs(gpuAttrs, map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			AttrType:       str(string(KindVFIO)),
			AttrIndex:      {IntValue: ptr.To(int64(gpu.Index))},
			AttrMinor:      {IntValue: ptr.To(int64(gpu.Minor))},
			AttrVendorID:   str(info.VendorID),
			AttrDeviceID:   str(info.DeviceID),
			AttrIOMMUGroup: {IntValue: ptr.To(int64(info.IOMMUGroup))},
		}),
		Capacity: gpuCapacity(gpu),
	}
}

// addVFIOBeside adds gpu's VFIO device next to its CUDA devices. Both
// consume all of the GPU's counter set: the one dynamic MIG made, or, for
// a GPU without one, a set holding the GPU's memory that the full GPU is
// made to consume as well.
func (m *Model) addVFIOBeside(gpu hardware.GPU, gpuAttrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, info VFIOInfo) error {
	name := CounterSetName(gpu.Minor)
	var set *resourceapi.CounterSet
	for i := range m.CounterSets {
		if m.CounterSets[i].Name == name {
			set = &m.CounterSets[i]
		}
	}
	if set == nil {
		m.CounterSets = append(m.CounterSets, resourceapi.CounterSet{
			Name:     name,
			Counters: map[string]resourceapi.Counter{CounterMemory: {Value: *resource.NewQuantity(int64(gpu.MemoryBytes), resource.BinarySI)}},
		})
		set = &m.CounterSets[len(m.CounterSets)-1]
		i, ok := m.byName[GPUName(gpu.Minor)]
		if !ok {
			return fmt.Errorf("GPU %d (%s): VFIO: the full GPU %s is not published", gpu.Index, gpu.UUID, GPUName(gpu.Minor))
		}
		m.Devices[i].API.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: name, Counters: nonZero(set.Counters)}}
	}
	api := vfioDevice(&gpu, gpuAttrs, info)
	api.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: name, Counters: nonZero(set.Counters)}}
	return m.add(Device{Kind: KindVFIO, API: api, GPU: gpu})
}
