package vfio

import (
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strings"
)

// NVIDIAVendor is the PCI vendor ID of NVIDIA, without "0x".
const NVIDIAVendor = "10de"

// graceGPUDeviceIDs are the PCI device IDs that the kernel's
// nvgrace-gpu-vfio-pci driver claims (drivers/vfio/pci/nvgrace-gpu/main.c,
// nvgrace_gpu_vfio_pci_table): the GPUs attached to a Grace CPU over
// NVLink-C2C, whose device memory is the CPU's cache-coherent memory and
// which plain vfio-pci cannot pass through whole.
var graceGPUDeviceIDs = []string{
	"2342", // GH200 120GB
	"2345", // GH200 480GB
	"2348", // GH200 SKU
	"2941", // GB200
	"31c2", // GB300 (Linux 6.18)
}

// GraceGPU reports whether a PCI function of NVIDIA with device ID
// deviceID (four hex digits, without "0x") is a Grace system's GPU, which
// nvgrace-gpu-vfio-pci passes through.
func GraceGPU(deviceID string) bool {
	return slices.Contains(graceGPUDeviceIDs, strings.ToLower(deviceID))
}

// GPUs returns the NVIDIA GPUs in sysfs: the PCI functions of vendor
// NVIDIA with a display controller class (0x03xxxx; audio and USB
// functions of the same card are not GPUs), ordered by bus ID, whatever
// driver they are bound to. A sysfs without PCI devices gives none.
func GPUs(fsys FS) ([]PCIDevice, error) {
	ids, err := fsys.ReadDir(pciDevicesDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("list PCI devices: %w", err)
	}
	var out []PCIDevice
	for _, id := range ids {
		if !ValidBusID(id) {
			continue
		}
		vendor, err := readHexAttr(fsys, devicePath(id, "vendor"), 4)
		if err != nil || vendor != NVIDIAVendor {
			continue // not NVIDIA's, or not a function whose identity can be read
		}
		d, err := ReadPCIDevice(fsys, id)
		if err != nil {
			return nil, err
		}
		if strings.HasPrefix(d.Class, "03") {
			out = append(out, d)
		}
	}
	slices.SortFunc(out, func(a, b PCIDevice) int { return strings.Compare(a.BusID, b.BusID) })
	return out, nil
}

// IsVFIODriver reports whether driver is one of the VFIO drivers GPUs are
// bound to for passthrough.
func IsVFIODriver(driver string) bool {
	return driver == VFIOPCI || driver == NVGraceGPUVFIOPCI
}

// DetectGPUDriver returns the VFIO driver the node's GPUs are passed
// through with: [NVGraceGPUVFIOPCI] when sysfs shows a Grace system's GPU
// (see [GraceGPU]), [VFIOPCI] otherwise. The PCI device ID is what the
// kernel itself matches the driver by, so the answer holds whether or not
// the module is loaded yet.
func DetectGPUDriver(fsys FS) (string, error) {
	gpus, err := GPUs(fsys)
	if err != nil {
		return "", fmt.Errorf("detect the VFIO driver: %w", err)
	}
	for _, g := range gpus {
		if GraceGPU(g.DeviceID) {
			return NVGraceGPUVFIOPCI, nil
		}
	}
	return VFIOPCI, nil
}
