package simnic

import (
	"fmt"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/pkg/cdi"
)

// Device numbers of the RDMA character devices, as the Linux RDMA core
// registers them: uverbs and umad under major 231 (IB_UVERBS_BASE_MINOR
// 192, IB_UMAD_MINOR_BASE 0), rdma_cm a misc device (major 10) whose minor
// the kernel assigns at load; 58 stands for it here. CDI device nodes with
// type, major and minor resolve without the host having them.
const (
	ibMajor         = 231
	uverbsBaseMinor = 192
	umadBaseMinor   = 0
	miscMajor       = 10
	rdmaCMMinor     = 58
)

// NCCLIBHCAEnv is the variable that tells NCCL which RDMA devices to use.
const NCCLIBHCAEnv = "NCCL_IB_HCA"

// buildSpec returns the CDI spec of a claim's NICs, given by their index on
// the node: a CDI device per NIC with its uverbs and umad nodes, and, for
// the claim as a whole, the RDMA connection manager's node and NCCL_IB_HCA
// naming exactly these devices.
func buildSpec(driverName, claimUID string, nics []int) *cdispec.Spec {
	spec := &cdispec.Spec{
		Version: cdi.SpecVersion, // gpudra's: the same version for every claim
		Kind:    cdi.Kind(driverName),
	}
	hcas := make([]string, len(nics))
	for j, i := range nics {
		hcas[j] = RDMADevice(i)
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name: cdi.DeviceName(claimUID, DeviceName(i)),
			ContainerEdits: cdispec.ContainerEdits{
				DeviceNodes: []*cdispec.DeviceNode{
					charNode(fmt.Sprintf("/dev/infiniband/uverbs%d", i), ibMajor, uverbsBaseMinor+i),
					charNode(fmt.Sprintf("/dev/infiniband/umad%d", i), ibMajor, umadBaseMinor+i),
				},
			},
		})
	}
	spec.ContainerEdits = cdispec.ContainerEdits{
		Env:         []string{NCCLIBHCAEnv + "=" + NCCLIBHCA(hcas)},
		DeviceNodes: []*cdispec.DeviceNode{charNode("/dev/infiniband/rdma_cm", miscMajor, rdmaCMMinor)},
	}
	return spec
}

// NCCLIBHCA returns the NCCL_IB_HCA value that selects exactly the named
// RDMA devices: a leading "=" makes NCCL match whole names, so that mlx5_1
// does not also select mlx5_10.
func NCCLIBHCA(devices []string) string { return "=" + strings.Join(devices, ",") }

func charNode(path string, major, minor int) *cdispec.DeviceNode {
	return &cdispec.DeviceNode{Path: path, Type: "c", Major: int64(major), Minor: int64(minor)}
}
