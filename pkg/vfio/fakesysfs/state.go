package fakesysfs

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
)

// A fake can keep the kernel's state in a file (Builder.StateFile), so
// that it outlives the process that changed it as a real kernel's does:
// which driver each function is bound to, its driver_override, its VFIO
// device node, the VFIO group nodes and the modules loaded. The fake
// starts from the file when it exists and writes every change through,
// atomically, before the write (or module load) that made it returns. A
// change that cannot be written is undone and fails with EIO. Holders are
// not kept: they are the test's processes, not the kernel's state.
// Several processes may drive one state file at once (shared.go); others
// may read it (ReadState).

const stateVersion = "v1"

// State is the content of a fake's state file.
type State struct {
	Version string `json:"version"`
	// Functions by bus ID.
	Functions map[string]FunctionState `json:"functions"`
	// Loaded are the drivers registered, sorted: built in or module
	// loaded.
	Loaded []string `json:"loaded"`
	// GroupMinors maps IOMMU groups (decimal) that have a /dev/vfio/<group>
	// node to its minor.
	GroupMinors map[string]int `json:"groupMinors,omitempty"`
}

// FunctionState is how one PCI function is bound.
type FunctionState struct {
	Driver   string `json:"driver,omitempty"`
	Override string `json:"override,omitempty"`
	// VFIODev is N of /dev/vfio/devices/vfio<N>; -1 for none.
	VFIODev int `json:"vfioDev"`
}

// StateFile makes the fake keep its state in the file at path: loaded by
// Build when the file exists, written through on every change.
func (b *Builder) StateFile(path string) *Builder {
	b.stateFile = path
	return b
}

// ReadState reads a fake's state file, for observers (tests, the chaos
// harness). It returns nil and no error when the file does not exist.
func ReadState(path string) (*State, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("fake sysfs state: %w", err)
	}
	var st State
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("fake sysfs state %s: %w", path, err)
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("fake sysfs state %s: version %q, want %q", path, st.Version, stateVersion)
	}
	return &st, nil
}

// stateLocked returns the fake's state; the caller holds s.mu or is
// building the fake.
func (s *Sysfs) stateLocked() *State {
	st := &State{Version: stateVersion, Functions: make(map[string]FunctionState, len(s.devices)), GroupMinors: map[string]int{}}
	for id, d := range s.devices {
		st.Functions[id] = FunctionState{Driver: d.driver, Override: d.override, VFIODev: d.vfioDev}
	}
	st.Loaded = slices.Sorted(maps.Keys(s.drivers))
	for g, m := range s.groupMinors {
		st.GroupMinors[strconv.Itoa(g)] = m
	}
	return st
}

// restoreLocked makes st the fake's state; the caller holds s.mu or is
// building the fake.
func (s *Sysfs) restoreLocked(st *State) error {
	if len(st.Functions) != len(s.devices) {
		return fmt.Errorf("state has %d PCI functions, the fake %d", len(st.Functions), len(s.devices))
	}
	all := maps.Clone(s.modules)
	maps.Copy(all, s.drivers)
	drivers, modules := map[string]*driver{}, maps.Clone(all)
	for _, name := range st.Loaded {
		drv, ok := all[name]
		if !ok {
			return fmt.Errorf("state has driver %q loaded, which the fake does not know", name)
		}
		drivers[name] = drv
		delete(modules, name)
	}
	devMinors := map[int]bool{}
	for id := range s.devices {
		f, ok := st.Functions[id]
		if !ok {
			return fmt.Errorf("state has no PCI function %s", id)
		}
		if _, ok := drivers[f.Driver]; f.Driver != "" && !ok {
			return fmt.Errorf("function %s: bound to %q, which is not loaded", id, f.Driver)
		}
		if f.VFIODev >= 0 {
			devMinors[f.VFIODev] = true
		}
	}
	groupMinors := map[int]int{}
	for g, m := range st.GroupMinors {
		n, err := strconv.Atoi(g)
		if err != nil {
			return fmt.Errorf("IOMMU group %q: %w", g, err)
		}
		groupMinors[n] = m
	}
	for id, d := range s.devices {
		f := st.Functions[id]
		d.driver, d.override, d.vfioDev = f.Driver, f.Override, f.VFIODev
	}
	s.drivers, s.modules, s.devMinors, s.groupMinors = drivers, modules, devMinors, groupMinors
	return nil
}

// loadState starts a fake being built from its state file, or writes the
// file when there is none yet, so that observers always find it.
func (s *Sysfs) loadState() error {
	st, err := ReadState(s.stateFile)
	if err != nil {
		return err
	}
	if st == nil {
		return s.persistLocked()
	}
	if err := s.restoreLocked(st); err != nil {
		return fmt.Errorf("fake sysfs state %s: %w", s.stateFile, err)
	}
	return nil
}

// persistLocked writes the state through to the state file, if any; the
// caller holds s.mu.
func (s *Sysfs) persistLocked() error {
	if s.stateFile == "" {
		return nil
	}
	data, err := json.MarshalIndent(s.stateLocked(), "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(s.stateFile), "."+filepath.Base(s.stateFile)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // nothing left after a successful rename
	data = append(data, '\n')
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), s.stateFile); err != nil {
		return err
	}
	s.lastState = data
	return nil
}

// change carries out fn, which changes the fake's state, and writes the
// result through; if that fails, the change is undone and the result is
// EIO. The caller holds s.mu.
func (s *Sysfs) change(fn func() error) error {
	if s.stateFile == "" {
		return fn()
	}
	before := s.stateLocked()
	if err := fn(); err != nil {
		return err
	}
	if err := s.persistLocked(); err != nil {
		if rerr := s.restoreLocked(before); rerr != nil {
			panic(fmt.Sprintf("fake sysfs: undo a change that could not be written: %v", rerr)) // the state came from this fake
		}
		return syscall.EIO
	}
	return nil
}
