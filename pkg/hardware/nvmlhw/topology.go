package nvmlhw

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"k8s.io/dynamic-resource-allocation/deviceattribute"
)

// Topology answers what NVML does not: where a PCI device sits in the
// machine. A GPU whose topology cannot be read is published without it;
// the error names the device.
type Topology interface {
	// PCIeRoot returns the PCIe root complex of the device at pciBusID
	// (extended BDF, lower case) as "pci<domain>:<bus>". It returns "" and
	// no error when the machine has no record of the device at all.
	PCIeRoot(pciBusID string) (string, error)
	// NUMANode returns the NUMA node of the device at pciBusID, or nil when
	// the device has no NUMA affinity or the machine has no record of it.
	NUMANode(pciBusID string) (*int, error)
}

// sysfsTopology implements [Topology] by reading sysfs.
type sysfsTopology struct {
	root string
}

// NewSysfsTopology returns a [Topology] that reads the sysfs tree mounted at
// sysfsRoot (normally "/sys").
func NewSysfsTopology(sysfsRoot string) Topology {
	return &sysfsTopology{root: sysfsRoot}
}

func (t *sysfsTopology) devicePath(pciBusID string) string {
	return filepath.Join(t.root, "bus", "pci", "devices", pciBusID)
}

// PCIeRoot implements [Topology].
func (t *sysfsTopology) PCIeRoot(pciBusID string) (string, error) {
	// Only a missing entry may pass silently; anything odd about an entry
	// that exists is an error, so that a broken mount is not mistaken for
	// a device without topology.
	path := t.devicePath(pciBusID)
	if _, err := os.Lstat(path); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		return "", readFailed(path, err)
	}
	attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(pciBusID, deviceattribute.WithFSFromRoot(t.root))
	if err != nil {
		return "", readFailed(path, err)
	}
	if attr.Value.StringValue == nil {
		return "", readFailed(path, errors.New("no PCIe root"))
	}
	return *attr.Value.StringValue, nil
}

// readFailed is the [queryError] of a sysfs file that could not be read:
// the query is the path, which names the device, and the error says why,
// without the path again.
func readFailed(path string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Path == path {
		err = pe.Err
	}
	return queryFailed(path, err)
}

// NUMANode implements [Topology].
func (t *sysfsTopology) NUMANode(pciBusID string) (*int, error) {
	path := filepath.Join(t.devicePath(pciBusID), "numa_node")
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, readFailed(path, err)
	}
	node, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return nil, readFailed(path, fmt.Errorf("not a NUMA node: %w", err))
	}
	// The kernel writes -1 for devices without NUMA affinity; such devices
	// must not publish the attribute.
	if node < 0 {
		return nil, nil
	}
	return &node, nil
}
