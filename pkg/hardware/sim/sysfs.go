package sim

import (
	"errors"
	"fmt"

	"github.com/gpudra/gpudra/pkg/vfio/fakesysfs"
)

// firstIOMMUGroup is the IOMMU group of a node's first GPU; the others
// follow, one group per GPU, as on DGX systems whose switches isolate
// each GPU (ACS).
const firstIOMMUGroup = 20

// Sysfs returns a fake sysfs of the node's PCI side, for VFIO passthrough:
// each GPU a function bound to nvidia (or to the VFIO driver its boundTo
// names), alone in its IOMMU group, with vfio-pci available as a module
// and iommufd offered. Each call starts
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
		// The device ID is the model's, as NVML reports it (device in
		// the upper half, vendor 10de in the lower): one table for both.
		m, ok := models()[g.Model]
		if !ok || m.PCIDeviceID == 0 {
			return nil, fmt.Errorf("simulated node %q: GPU %d: no PCI device ID for model %s", n.Name, i, g.Model)
		}
		device := fmt.Sprintf("%04x", m.PCIDeviceID>>16)
		f := fakesysfs.Function{
			BusID: g.PCIBusID, Vendor: fakesysfs.NVIDIAVendor, Device: device,
			Class: "030200", IOMMUGroup: firstIOMMUGroup + i, Driver: "nvidia",
		}
		if g.BoundTo != "" {
			// Bound by the node's set-up: the driver is loaded and
			// driver_override names it.
			f.Driver, f.DriverOverride = g.BoundTo, g.BoundTo
			b.Driver(fakesysfs.Driver{Name: g.BoundTo, VFIO: true, Loaded: true})
		}
		b.Function(f)
	}
	return b.Build()
}
