package vfio

import (
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
)

// Plan returns what binding the IOMMU group of the GPU at busID to VFIO
// changes, without changing anything. It refuses a GPU without an IOMMU
// group (IOMMU off), a group holding functions of another PCI slot (the
// platform does not isolate the GPU, and unbinding them could take, say, the
// node's NIC away), and a function with SR-IOV virtual functions enabled.
// PCI bridges in the group are left out of the record: they keep their
// driver (pcieport), which VFIO accepts in a group.
func (b *Binder) Plan(busID string) (Record, error) {
	rec, err := b.plan(busID)
	if err != nil {
		return Record{}, fmt.Errorf("plan VFIO binding of GPU %s: %w", busID, err)
	}
	return rec, nil
}

func (b *Binder) plan(busID string) (Record, error) {
	if err := checkBusID(busID); err != nil {
		return Record{}, err
	}
	switch ok, err := b.fs.Exists(devicePath(busID)); {
	case err != nil:
		return Record{}, fmt.Errorf("look up PCI device: %w", err)
	case !ok:
		return Record{}, fmt.Errorf("no PCI device %s in sysfs: %w", devicePath(busID), fs.ErrNotExist)
	}
	group, err := iommuGroupOf(b.fs, busID)
	switch {
	case err != nil:
		return Record{}, err
	case group == nil:
		return Record{}, fmt.Errorf("no IOMMU group (%s is missing): the IOMMU is off; boot with intel_iommu=on or amd_iommu=on", devicePath(busID, "iommu_group"))
	}
	members, err := b.groupFunctions(*group)
	if err != nil {
		return Record{}, err
	}
	if !slices.Contains(members, busID) {
		return Record{}, fmt.Errorf("IOMMU group %d does not list the GPU among its devices", *group)
	}
	rec := Record{GPU: busID, IOMMUGroup: *group}
	for _, member := range members {
		if slot(member) != slot(busID) {
			return Record{}, fmt.Errorf("IOMMU group %d also holds %s, which is not a function of the GPU's slot %s: the platform does not isolate the GPU (no PCIe ACS), refusing to unbind that device", *group, member, slot(busID))
		}
		if err := b.checkNoVFs(member); err != nil {
			return Record{}, err
		}
		st, err := b.state(member)
		if err != nil {
			return Record{}, fmt.Errorf("function %s: %w", member, err)
		}
		driver := VFIOPCI
		if member == busID {
			driver = b.gpuDriver
		}
		rec.Functions = append(rec.Functions, Function{
			BusID: member, Driver: driver, OriginalDriver: st.driver, OriginalDriverOverride: st.override,
		})
	}
	return rec, nil
}

// groupFunctions lists the functions of an IOMMU group that binding moves:
// all but PCI bridges, sorted by bus ID.
func (b *Binder) groupFunctions(group int) ([]string, error) {
	dir := iommuGroupsDir + "/" + strconv.Itoa(group) + "/devices"
	names, err := b.fs.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list IOMMU group %d: %w", group, err)
	}
	var members []string
	for _, name := range names {
		if err := checkBusID(name); err != nil {
			return nil, fmt.Errorf("IOMMU group %d: %s: %w", group, dir, err)
		}
		class, err := readHexAttr(b.fs, devicePath(name, "class"), 6)
		if err != nil {
			return nil, fmt.Errorf("IOMMU group %d: function %s: %w", group, name, err)
		}
		if !strings.HasPrefix(class, pciBridgeClass) {
			members = append(members, name)
		}
	}
	slices.Sort(members)
	return members, nil
}

// pciBridgeClass is the PCI base class of bridges.
const pciBridgeClass = "06"

// slot returns the domain:bus:device part of a bus ID.
func slot(busID string) string {
	s, _, _ := strings.Cut(busID, ".")
	return s
}

func (b *Binder) checkNoVFs(busID string) error {
	name := devicePath(busID, "sriov_numvfs")
	if ok, err := b.fs.Exists(name); err != nil || !ok {
		return err
	}
	s, err := readAttr(b.fs, name)
	if err != nil {
		return fmt.Errorf("function %s: %w", busID, err)
	}
	if n, err := strconv.Atoi(s); err != nil || n != 0 {
		return fmt.Errorf("function %s has SR-IOV virtual functions enabled (%s = %q); disable them first", busID, name, s)
	}
	return nil
}

// functionState is a function's binding as sysfs shows it now; state
// reads it.
type functionState struct {
	driver   string // "" when unbound
	override string // "" when unset
}

func (b *Binder) state(busID string) (functionState, error) {
	driver, err := linkBase(b.fs, devicePath(busID, "driver"))
	if err != nil {
		return functionState{}, fmt.Errorf("read driver: %w", err)
	}
	override, err := readAttr(b.fs, devicePath(busID, "driver_override"))
	if err != nil {
		return functionState{}, fmt.Errorf("read driver_override: %w", err)
	}
	if override == noDriverOverride {
		override = ""
	}
	return functionState{driver: driver, override: override}, nil
}
