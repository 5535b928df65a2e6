package vfio

import (
	"fmt"
	"strconv"
	"strings"
)

// Backend is the kernel interface a VFIO device reaches the workload
// through.
type Backend string

const (
	// LegacyBackend is the VFIO group interface: /dev/vfio/<group>, with
	// /dev/vfio/vfio as the API device.
	LegacyBackend Backend = "legacy"
	// IOMMUFDBackend is the VFIO device interface on iommufd:
	// /dev/vfio/devices/vfio<N> per function, with /dev/iommu as the API
	// device.
	IOMMUFDBackend Backend = "iommufd"
)

// NodeOptions says which device nodes a workload wants; the fields mirror
// the iommu section of a VfioDeviceConfig.
type NodeOptions struct {
	// PreferIOMMUFD picks the iommufd backend when the kernel offers it and
	// every function has a VFIO device node, and the legacy one otherwise.
	PreferIOMMUFD bool
	// APIDevice adds the backend's API device.
	APIDevice bool
}

// DeviceNode is a character device a container needs. Path is the same on
// the host and in the container.
type DeviceNode struct {
	Path  string
	Major int64
	Minor int64
}

// Nodes are the device nodes of one bound IOMMU group.
type Nodes struct {
	// Backend is the backend chosen.
	Backend Backend
	// DeviceNodes are the API device first (when asked for), then the
	// group's node or one node per function in the record's order.
	DeviceNodes []DeviceNode
}

// Sysfs "dev" attributes of the nodes. The group node's minor is not the
// group number (the kernel allocates group minors separately), so it is
// read from the group's class device, like every other number.
const (
	vfioAPIDev  = miscClass + "/vfio/dev"  // /dev/vfio/vfio, misc 10:196
	iommuAPIDev = miscClass + "/iommu/dev" // /dev/iommu, misc, dynamic minor
)

// DeviceNodes returns the device nodes of the IOMMU group rec describes,
// which Bind has bound, with the numbers sysfs gives them, so that a CDI
// spec can carry type, major and minor and the runtime need not stat the
// host.
func DeviceNodes(fsys FS, rec Record, opts NodeOptions) (Nodes, error) {
	if err := rec.Validate(); err != nil {
		return Nodes{}, err
	}
	nodes, err := deviceNodes(fsys, rec, opts)
	if err != nil {
		return Nodes{}, fmt.Errorf("VFIO device nodes of IOMMU group %d (GPU %s): %w", rec.IOMMUGroup, rec.GPU, err)
	}
	return nodes, nil
}

func deviceNodes(fsys FS, rec Record, opts NodeOptions) (Nodes, error) {
	if opts.PreferIOMMUFD {
		available, err := IOMMUFDAvailable(fsys)
		if err != nil {
			return Nodes{}, err
		}
		if available {
			cdevs, ok, err := functionNodes(fsys, rec)
			if err != nil {
				return Nodes{}, err
			}
			if ok {
				return withAPIDevice(fsys, IOMMUFDBackend, "/dev/iommu", iommuAPIDev, opts.APIDevice, cdevs)
			}
		}
	}
	group := strconv.Itoa(rec.IOMMUGroup)
	groupNode, err := node(fsys, "/dev/vfio/"+group, vfioGroupClass+"/"+group+"/dev")
	if err != nil {
		return Nodes{}, err
	}
	return withAPIDevice(fsys, LegacyBackend, "/dev/vfio/vfio", vfioAPIDev, opts.APIDevice, []DeviceNode{groupNode})
}

func withAPIDevice(fsys FS, backend Backend, path, devAttr string, want bool, nodes []DeviceNode) (Nodes, error) {
	if !want {
		return Nodes{Backend: backend, DeviceNodes: nodes}, nil
	}
	api, err := node(fsys, path, devAttr)
	if err != nil {
		return Nodes{}, err
	}
	return Nodes{Backend: backend, DeviceNodes: append([]DeviceNode{api}, nodes...)}, nil
}

// functionNodes returns /dev/vfio/devices/vfio<N> of every function, or
// false when one has none (a kernel without VFIO device cdevs).
func functionNodes(fsys FS, rec Record) ([]DeviceNode, bool, error) {
	var nodes []DeviceNode
	for _, f := range rec.Functions {
		dir := devicePath(f.BusID, vfioDevDir)
		ok, err := fsys.Exists(dir)
		if err != nil || !ok {
			return nil, false, err
		}
		names, err := fsys.ReadDir(dir)
		if err != nil {
			return nil, false, fmt.Errorf("function %s: %w", f.BusID, err)
		}
		if len(names) != 1 || !strings.HasPrefix(names[0], "vfio") {
			return nil, false, fmt.Errorf("function %s: %s holds %v, want one vfio<N>", f.BusID, dir, names)
		}
		if _, err := strconv.Atoi(strings.TrimPrefix(names[0], "vfio")); err != nil {
			return nil, false, fmt.Errorf("function %s: %s holds %q, want vfio<N>", f.BusID, dir, names[0])
		}
		devAttr := dir + "/" + names[0] + "/dev"
		if ok, err := fsys.Exists(devAttr); err != nil || !ok {
			return nil, false, err
		}
		n, err := node(fsys, "/dev/vfio/devices/"+names[0], devAttr)
		if err != nil {
			return nil, false, fmt.Errorf("function %s: %w", f.BusID, err)
		}
		nodes = append(nodes, n)
	}
	return nodes, true, nil
}

func node(fsys FS, path, devAttr string) (DeviceNode, error) {
	major, minor, err := readDevNumber(fsys, devAttr)
	if err != nil {
		return DeviceNode{}, fmt.Errorf("device number of %s: %w", path, err)
	}
	return DeviceNode{Path: path, Major: major, Minor: minor}, nil
}
