package fakesysfs

import (
	"cmp"
	"fmt"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// entry is what a path resolves to: a directory (list), an attribute (show
// and/or store) or a symbolic link.
type entry struct {
	list  func() []string
	show  func() string
	store func(value string) error
	link  string
}

func dir(names ...string) *entry { return &entry{list: func() []string { return names }} }

// lookup resolves a slash-separated path relative to the root, following
// the links sysfs paths go through. It runs with s.mu held.
func (s *Sysfs) lookup(name string) *entry {
	if name == "" || path.IsAbs(name) || path.Clean(name) != name {
		return nil
	}
	p := strings.Split(name, "/")
	switch {
	case name == ".":
		return dir("bus", "class", "kernel")
	case len(p) >= 2 && p[0] == "bus" && p[1] == "pci":
		return s.lookupPCI(p[2:])
	case len(p) >= 1 && p[0] == "kernel":
		return s.lookupGroups(p[1:])
	case len(p) >= 1 && p[0] == "class":
		return s.lookupClass(p[1:])
	case name == "bus":
		return dir("pci")
	}
	return nil
}

func (s *Sysfs) lookupPCI(p []string) *entry {
	switch {
	case len(p) == 0:
		return dir("devices", "drivers", "drivers_probe")
	case p[0] == "devices" && len(p) == 1:
		return &entry{list: func() []string { return slices.Sorted(maps.Keys(s.devices)) }}
	case p[0] == "devices":
		if d, ok := s.devices[p[1]]; ok {
			return s.lookupDevice(d, p[2:])
		}
	case p[0] == "drivers" && len(p) == 1:
		return &entry{list: func() []string { return slices.Sorted(maps.Keys(s.drivers)) }}
	case p[0] == "drivers":
		if drv, ok := s.drivers[p[1]]; ok {
			return s.lookupDriver(drv, p[2:])
		}
	case p[0] == "drivers_probe" && len(p) == 1:
		return &entry{store: s.storeProbe}
	}
	return nil
}

func (s *Sysfs) lookupDevice(d *device, p []string) *entry {
	if len(p) == 0 {
		names := []string{"class", "device", "driver_override", "vendor"}
		if !s.noIOMMU {
			names = append(names, "iommu_group")
		}
		if d.driver != "" {
			names = append(names, "driver")
		}
		if d.sriovVFs != nil {
			names = append(names, "sriov_numvfs")
		}
		if d.vfioDev >= 0 {
			names = append(names, "vfio-dev")
		}
		slices.Sort(names)
		return dir(names...)
	}
	switch {
	case len(p) == 1 && p[0] == "vendor":
		return &entry{show: func() string { return "0x" + d.vendor }}
	case len(p) == 1 && p[0] == "device":
		return &entry{show: func() string { return "0x" + d.deviceID }}
	case len(p) == 1 && p[0] == "class":
		return &entry{show: func() string { return "0x" + d.class }}
	case len(p) == 1 && p[0] == "driver_override":
		return &entry{
			show:  func() string { return cmp.Or(d.override, "(null)") },
			store: func(v string) error { return s.storeOverride(d, v) },
		}
	case len(p) == 1 && p[0] == "sriov_numvfs" && d.sriovVFs != nil:
		return &entry{show: func() string { return strconv.Itoa(*d.sriovVFs) }}
	case len(p) == 1 && p[0] == "iommu_group" && !s.noIOMMU:
		return &entry{link: "../../../../kernel/iommu_groups/" + strconv.Itoa(d.group)}
	case p[0] == "driver" && d.driver != "":
		if len(p) == 1 {
			return &entry{link: "../../../../bus/pci/drivers/" + d.driver, list: s.lookupDriver(s.drivers[d.driver], nil).list}
		}
		return s.lookupDriver(s.drivers[d.driver], p[1:])
	case p[0] == "vfio-dev" && d.vfioDev >= 0:
		cdev := "vfio" + strconv.Itoa(d.vfioDev)
		switch {
		case len(p) == 1:
			return dir(cdev)
		case len(p) == 2 && p[1] == cdev:
			return dir("dev")
		case len(p) == 3 && p[1] == cdev && p[2] == "dev":
			return &entry{show: func() string { return fmt.Sprintf("%d:%d", VFIODevMajor, d.vfioDev) }}
		}
	}
	return nil
}

func (s *Sysfs) lookupDriver(drv *driver, p []string) *entry {
	switch {
	case len(p) == 0:
		return &entry{list: func() []string {
			names := []string{"bind", "unbind"}
			for id, d := range s.devices {
				if d.driver == drv.name {
					names = append(names, id)
				}
			}
			slices.Sort(names)
			return names
		}}
	case len(p) == 1 && p[0] == "bind":
		return &entry{store: func(v string) error { return s.storeBind(drv, v) }}
	case len(p) == 1 && p[0] == "unbind":
		return &entry{store: func(v string) error { return s.storeUnbind(drv, v) }}
	}
	return nil
}

// lookupGroups resolves kernel/iommu_groups/...
func (s *Sysfs) lookupGroups(p []string) *entry {
	switch {
	case len(p) == 0:
		return dir("iommu_groups")
	case p[0] != "iommu_groups":
		return nil
	}
	groups := make(map[string][]string)
	if !s.noIOMMU {
		for id, d := range s.devices {
			g := strconv.Itoa(d.group)
			groups[g] = append(groups[g], id)
		}
	}
	if len(p) == 1 {
		return dir(slices.Sorted(maps.Keys(groups))...)
	}
	members, ok := groups[p[1]]
	if !ok {
		return nil
	}
	slices.Sort(members)
	switch {
	case len(p) == 2:
		return dir("devices")
	case len(p) == 3 && p[2] == "devices":
		return dir(members...)
	case len(p) == 4 && p[2] == "devices" && slices.Contains(members, p[3]):
		return &entry{link: "../../../../devices/pci0000:00/" + p[3]}
	}
	return nil
}

// lookupClass resolves class/vfio/... and class/misc/{vfio,iommu}/...
func (s *Sysfs) lookupClass(p []string) *entry {
	misc := map[string]int{}
	if s.vfioCoreLoaded() {
		misc["vfio"] = VFIOMiscMinor
	}
	if s.iommufd {
		misc["iommu"] = IOMMUMiscMinor
	}
	switch {
	case len(p) == 0:
		return dir("misc", "vfio")
	case p[0] == "misc" && len(p) == 1:
		return dir(slices.Sorted(maps.Keys(misc))...)
	case p[0] == "misc":
		minor, ok := misc[p[1]]
		return devEntry(ok, p[2:], MiscMajor, minor)
	case p[0] == "vfio" && len(p) == 1:
		var names []string
		for _, g := range slices.Sorted(maps.Keys(s.groupMinors)) {
			names = append(names, strconv.Itoa(g))
		}
		return dir(names...)
	case p[0] == "vfio":
		group, err := strconv.Atoi(p[1])
		minor, ok := s.groupMinors[group]
		return devEntry(ok && err == nil && strconv.Itoa(group) == p[1], p[2:], VFIOGroupMajor, minor)
	}
	return nil
}

// devEntry resolves a class device's directory (rest empty) or its dev
// attribute.
func devEntry(exists bool, rest []string, major, minor int) *entry {
	switch {
	case !exists:
		return nil
	case len(rest) == 0:
		return dir("dev")
	case len(rest) == 1 && rest[0] == "dev":
		return &entry{show: func() string { return fmt.Sprintf("%d:%d", major, minor) }}
	}
	return nil
}

// ReadFile implements vfio.FS.
func (s *Sysfs) ReadFile(name string) ([]byte, error) {
	defer s.lock()()
	if err := s.failure(OpRead, name); err != nil {
		return nil, s.pathError(OpRead, name, err)
	}
	e := s.lookup(name)
	switch {
	case e == nil:
		return nil, s.pathError("open", name, syscall.ENOENT)
	case e.list != nil:
		return nil, s.pathError(OpRead, name, syscall.EISDIR)
	case e.show == nil:
		return nil, s.pathError("open", name, syscall.EACCES)
	}
	return []byte(e.show() + "\n"), nil
}

// WriteFile implements vfio.FS.
func (s *Sysfs) WriteFile(name string, data []byte) error {
	unlock := s.lock()
	took, err := s.writeLocked(name, data)
	var hooks []func(string)
	if took {
		s.wrote()
		hooks = slices.Clone(s.onWrite)
	}
	unlock()
	for _, fn := range hooks {
		fn(name)
	}
	return err
}

// writeLocked carries out a write and reports whether it took effect. A
// blocking fault releases s.mu while it holds the write.
func (s *Sysfs) writeLocked(name string, data []byte) (bool, error) {
	f := s.fault(OpWrite, name)
	if f != nil && f.Block != nil {
		s.mu.Unlock()
		<-f.Block
		s.mu.Lock()
		f = nil
		if s.crashed {
			f = crashFault
		}
	}
	switch {
	case f != nil && f.Drop:
		return false, nil
	case f != nil:
		return false, s.pathError(OpWrite, name, f.Err)
	}
	e := s.lookup(name)
	switch {
	case e == nil:
		return false, s.pathError("open", name, syscall.ENOENT)
	case e.list != nil:
		return false, s.pathError("open", name, syscall.EISDIR)
	case e.store == nil:
		return false, s.pathError("open", name, syscall.EACCES)
	}
	if err := s.change(func() error { return e.store(string(data)) }); err != nil {
		return false, s.pathError(OpWrite, name, err)
	}
	return true, nil
}

// Readlink implements vfio.FS.
func (s *Sysfs) Readlink(name string) (string, error) {
	defer s.lock()()
	if err := s.failure(OpReadlink, name); err != nil {
		return "", s.pathError(OpReadlink, name, err)
	}
	e := s.lookup(name)
	switch {
	case e == nil:
		return "", s.pathError(OpReadlink, name, syscall.ENOENT)
	case e.link == "":
		return "", s.pathError(OpReadlink, name, syscall.EINVAL)
	}
	return e.link, nil
}

// ReadDir implements vfio.FS.
func (s *Sysfs) ReadDir(name string) ([]string, error) {
	defer s.lock()()
	if err := s.failure(OpReadDir, name); err != nil {
		return nil, s.pathError("open", name, err)
	}
	e := s.lookup(name)
	switch {
	case e == nil:
		return nil, s.pathError("open", name, syscall.ENOENT)
	case e.list == nil:
		return nil, s.pathError("readdirent", name, syscall.ENOTDIR)
	}
	return slices.Clone(e.list()), nil
}

// Exists implements vfio.FS.
func (s *Sysfs) Exists(name string) (bool, error) {
	defer s.lock()()
	if err := s.failure(OpExists, name); err != nil {
		return false, s.pathError(OpExists, name, err)
	}
	return s.lookup(name) != nil, nil
}
