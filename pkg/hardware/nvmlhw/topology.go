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
// machine.
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
	if _, err := os.Lstat(t.devicePath(pciBusID)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", nil
		}
		return "", fmt.Errorf("PCIe root of %s: %w", pciBusID, err)
	}
	attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(pciBusID, deviceattribute.WithFSFromRoot(t.root))
	if err != nil {
		return "", fmt.Errorf("PCIe root of %s under %s: %w", pciBusID, t.root, err)
	}
	if attr.Value.StringValue == nil {
		return "", fmt.Errorf("PCIe root of %s under %s: no value", pciBusID, t.root)
	}
	return *attr.Value.StringValue, nil
}

// NUMANode implements [Topology].
func (t *sysfsTopology) NUMANode(pciBusID string) (*int, error) {
	path := filepath.Join(t.devicePath(pciBusID), "numa_node")
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("NUMA node of %s: %w", pciBusID, err)
	}
	node, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return nil, fmt.Errorf("NUMA node of %s: parse %s: %w", pciBusID, path, err)
	}
	// The kernel writes -1 for devices without NUMA affinity; such devices
	// must not publish the attribute.
	if node < 0 {
		return nil, nil
	}
	return &node, nil
}
