package sim

import (
	"errors"
	"fmt"

	"github.com/gpudra/gpudra/pkg/vfio/fakesysfs"
)

// pciDeviceIDs are the PCI device IDs of the simulated models (the kernel's
// pci.ids and NVIDIA's listings; vendor 10de).
var pciDeviceIDs = map[string]string{
	"A100-SXM4-40GB":  "20b0",
	"A100-SXM4-80GB":  "20b2",
	"H100-SXM5-80GB":  "2330",
	"H200-SXM5-141GB": "2335",
}

// firstIOMMUGroup is the IOMMU group of a node's first GPU; the others
// follow, one group per GPU, as on DGX systems whose switches isolate
// each GPU (ACS).
const firstIOMMUGroup = 20

// Sysfs returns a fake sysfs of the node's PCI side, for VFIO passthrough:
// each GPU a function bound to nvidia, alone in its IOMMU group, with
// vfio-pci available as a module and iommufd offered. Each call starts
// from the node's description.
func (n *Node) Sysfs() (*fakesysfs.Sysfs, error) {
	return n.sysfs("")
}

// SysfsWithState is Sysfs with the kernel's state kept in the file at
// stateFile, so that bindings outlive the process that made them (see
// fakesysfs.Builder.StateFile): it starts from the file when it exists.
func (n *Node) SysfsWithState(stateFile string) (*fakesysfs.Sysfs, error) {
	return n.sysfs(stateFile)
}

func (n *Node) sysfs(stateFile string) (*fakesysfs.Sysfs, error) {
	c := n.clone()
	p := &problems{where: fmt.Sprintf("simulated node %q: ", n.Name)}
	c.resolve(p)
	if err := errors.Join(p.errs...); err != nil {
		return nil, err
	}
	b := fakesysfs.NewBuilder().IOMMUFD()
	if stateFile != "" {
		b.StateFile(stateFile)
	}
	for i, g := range c.GPUs {
		device, ok := pciDeviceIDs[g.Model]
		if !ok {
			return nil, fmt.Errorf("simulated node %q: GPU %d: no PCI device ID for model %s", n.Name, i, g.Model)
		}
		b.Function(fakesysfs.Function{
			BusID: g.PCIBusID, Vendor: fakesysfs.NVIDIAVendor, Device: device,
			Class: "030200", IOMMUGroup: firstIOMMUGroup + i, Driver: "nvidia",
		})
	}
	return b.Build()
}
