// Package simnic is a simulated RDMA NIC DRA driver for the local cluster:
// it publishes a node's NICs from its fleet file (package sim's nics:) with
// the standard PCIe attributes, so that a claim can pair a GPU of gpudra's
// with a NIC under the same PCIe root, and prepares them as a network DRA
// driver would, with a CDI spec giving the container the NIC's RDMA device
// nodes and NCCL_IB_HCA.
//
// It lives in the local-cluster module only: gpudra serves GPUs, never
// NICs. No upstream network DRA driver serves here: google/dranet, the one
// that publishes RDMA NICs, finds them through netlink and sysfs and attaches
// them through NRI, none of which a simulated node has (and the Go module
// proxy refuses its module).
package simnic

import (
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/hardware/sim"
)

// DefaultDriverName is the simulated NIC driver's name, and that of its
// DeviceClass.
const DefaultDriverName = "nic.sim.gpudra.io"

// Attributes of a NIC device, in the driver's domain, beside the standard
// resource.kubernetes.io/pcieRoot, pciBusID and numaNode.
const (
	// AttrType is "nic", as gpudra's devices say "gpu" or "mig".
	AttrType = "type"
	// AttrModel is the adapter model, e.g. "ConnectX-7".
	AttrModel = "model"
	// AttrLinkType is "infiniband" or "ethernet".
	AttrLinkType = "linkType"
	// AttrSpeedGbps is the port speed in Gb/s.
	AttrSpeedGbps = "speedGbps"
	// AttrRDMA says the device does RDMA (always true here), for
	// selectors written for drivers that also publish plain NICs.
	AttrRDMA = "rdma"
	// AttrRDMADevice is the RDMA device name NCCL selects, "mlx5_<i>".
	AttrRDMADevice = "rdmaDevice"
)

// TypeNIC is the value of [AttrType].
const TypeNIC = "nic"

// DeviceName is the DRA device name of the node's NIC at index i.
func DeviceName(i int) string { return fmt.Sprintf("nic-%d", i) }

// RDMADevice is the RDMA device name of the node's NIC at index i, as the
// mlx5 driver names ConnectX and BlueField adapters in probe order.
func RDMADevice(i int) string { return fmt.Sprintf("mlx5_%d", i) }

// Devices returns the DRA devices of a node's NICs, in fleet order.
func Devices(nics []sim.NIC) ([]resourceapi.Device, error) {
	devices := make([]resourceapi.Device, 0, len(nics))
	for i, nic := range nics {
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			AttrType:       {StringValue: ptr.To(TypeNIC)},
			AttrModel:      {StringValue: ptr.To(nic.Model)},
			AttrLinkType:   {StringValue: ptr.To(nic.LinkType)},
			AttrSpeedGbps:  {IntValue: ptr.To(int64(nic.SpeedGbps))},
			AttrRDMA:       {BoolValue: ptr.To(true)},
			AttrRDMADevice: {StringValue: ptr.To(RDMADevice(i))},
			deviceattribute.StandardDeviceAttributePCIeRoot: {StringValue: ptr.To(nic.PCIeRoot)},
		}
		if nic.PCIBusID != "" {
			a, err := deviceattribute.GetPCIBusIDAttribute(nic.PCIBusID)
			if err != nil {
				return nil, fmt.Errorf("NIC %d: %w", i, err)
			}
			attrs[a.Name] = a.Value
		}
		// A NIC with no NUMA affinity publishes none: a value for "none"
		// would match every other such device.
		if nic.NUMANode != nil && *nic.NUMANode >= 0 {
			a, err := deviceattribute.GetNUMANodeAttribute(*nic.NUMANode, deviceattribute.ScalarAttribute)
			if err != nil {
				return nil, fmt.Errorf("NIC %d: %w", i, err)
			}
			attrs[a.Name] = a.Value
		}
		devices = append(devices, resourceapi.Device{Name: DeviceName(i), Attributes: attrs})
	}
	return devices, nil
}

// DriverResources returns what the driver publishes for a node: one pool
// named after the node, in slices of at most
// [resourceapi.ResourceSliceMaxDevices] devices.
func DriverResources(nodeName string, nics []sim.NIC) (resourceslice.DriverResources, error) {
	devices, err := Devices(nics)
	if err != nil {
		return resourceslice.DriverResources{}, err
	}
	var pool resourceslice.Pool
	for chunk := range slices.Chunk(devices, resourceapi.ResourceSliceMaxDevices) {
		pool.Slices = append(pool.Slices, resourceslice.Slice{Devices: chunk})
	}
	if len(pool.Slices) == 0 {
		pool.Slices = []resourceslice.Slice{{}}
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{nodeName: pool}}, nil
}

// DeviceClass returns the DeviceClass of the driver's NICs, named after
// the driver as gpudra's gpu.nvidia.com class is.
func DeviceClass(driverName string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: driverName},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf("device.driver == %q", driverName),
			}}},
		},
	}
}
