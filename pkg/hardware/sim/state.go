package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
)

// The state of a simulated node's GPUs can live in a file, as a real GPU's
// state lives in the GPU and outlives the process that changed it: MIG
// modes, minors, GPU instances and compute instances (with their MIG
// device UUIDs). [WithStateFile] names the file. Hardware made with it
// starts from the file when it exists (the node's description otherwise)
// and writes every change through, atomically (a temporary file renamed
// over it), before the NVML call that made the change returns. A process
// killed at any moment thus leaves the state of its last completed call,
// and the next process that makes the node's hardware sees what the killed
// one left, leaks included, as a restarted plugin on a real node does.
//
// Several processes may drive one state file at once (shared.go), as two
// plugin instances drive a node's GPUs during a rolling update; others may
// read it ([ReadState]). A reboot, which would destroy MIG instances on real
// hardware, is not simulated.

// stateVersion is the format of the state file.
const stateVersion = "v1"

// State is the content of a simulated node's state file.
type State struct {
	Version string `json:"version"`
	// Created counts the compute instances ever created, which keeps the
	// UUIDs of new MIG devices new across processes.
	Created int `json:"created"`
	// GPUs by UUID.
	GPUs map[string]GPUState `json:"gpus"`
}

// GPUState is what can change on one GPU.
type GPUState struct {
	Minor      int  `json:"minor"`
	MIGEnabled bool `json:"migEnabled"`
	MIGPending bool `json:"migPending"`
	// GPUInstances in creation order.
	GPUInstances []GPUInstanceState `json:"gpuInstances,omitempty"`
}

// GPUInstanceState is one GPU instance.
type GPUInstanceState struct {
	Profile string `json:"profile"`
	Start   int    `json:"start"`
	// ID is the GPU instance ID NVML reports.
	ID               int                    `json:"id"`
	ComputeInstances []ComputeInstanceState `json:"computeInstances,omitempty"`
}

// ComputeInstanceState is one compute instance and its MIG device.
type ComputeInstanceState struct {
	ID     int    `json:"id"`
	Start  int    `json:"start"`
	Slices int    `json:"slices"`
	UUID   string `json:"uuid"`
}

// WithStateFile keeps the hardware's state in the file at path (see
// [State]): loaded when the hardware is made, if the file exists, and
// written through on every change. A file that cannot be read or does not
// fit the node makes the hardware broken: every call reports why.
func WithStateFile(path string) HardwareOption {
	return func(o *hardwareOptions) { o.stateFile = path }
}

// ReadState reads a state file, for observers of a simulated node (tests,
// the chaos harness). It returns nil and no error when the file does not
// exist: the node is as its description says.
func ReadState(path string) (*State, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("simulated hardware state: %w", err)
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("simulated hardware state %s: %w", path, err)
	}
	if s.Version != stateVersion {
		return nil, fmt.Errorf("simulated hardware state %s: version %q, want %q", path, s.Version, stateVersion)
	}
	return &s, nil
}

// MIGDevices returns the UUIDs of the MIG devices that exist on the GPU.
func (s GPUState) MIGDevices() []string {
	var out []string
	for _, gi := range s.GPUInstances {
		for _, ci := range gi.ComputeInstances {
			out = append(out, ci.UUID)
		}
	}
	return out
}

// snapshotLocked returns the fake's state; the caller holds f.mu.
func (f *fakeNVML) snapshotLocked() *State {
	s := &State{Version: stateVersion, Created: f.created, GPUs: make(map[string]GPUState, len(f.devices))}
	for _, d := range f.devices {
		g := GPUState{Minor: d.minor, MIGEnabled: d.migEnabled, MIGPending: d.migPending}
		for _, gi := range d.gis {
			gs := GPUInstanceState{Profile: gi.profile.Name, Start: gi.start, ID: gi.id}
			for _, ci := range gi.cis {
				gs.ComputeInstances = append(gs.ComputeInstances, ComputeInstanceState{
					ID: ci.id, Start: ci.start, Slices: ci.slices, UUID: d.migUUID(ci),
				})
			}
			g.GPUInstances = append(g.GPUInstances, gs)
		}
		s.GPUs[d.uuid] = g
	}
	return s
}

// migUUID returns the UUID of ci's MIG device; the caller holds nv.mu.
func (d *fakeDevice) migUUID(ci *fakeCI) string {
	for _, m := range d.migs {
		if m.ci == ci {
			return m.uuid
		}
	}
	return ""
}

// restore replaces the MIG state the node's description gave with s. It
// runs before the fake is shared.
func (f *fakeNVML) restore(s *State) error {
	if len(s.GPUs) != len(f.devices) {
		return fmt.Errorf("state has %d GPUs, the node %d", len(s.GPUs), len(f.devices))
	}
	f.created = s.Created
	for _, d := range f.devices {
		g, ok := s.GPUs[d.uuid]
		if !ok {
			return fmt.Errorf("state has no GPU %s", d.uuid)
		}
		d.minor, d.migEnabled, d.migPending = g.Minor, g.MIGEnabled, g.MIGPending
		d.gis, d.migs = nil, nil
		for _, gs := range g.GPUInstances {
			p, ok := d.model.profile(gs.Profile)
			if !ok {
				return fmt.Errorf("GPU %s: unknown MIG profile %q", d.uuid, gs.Profile)
			}
			gi := d.newGI(p, gs.Start)
			if gi.id != gs.ID {
				return fmt.Errorf("GPU %s: GPU instance %s at %d has ID %d, want %d", d.uuid, gs.Profile, gs.Start, gs.ID, gi.id)
			}
			for _, cs := range gs.ComputeInstances {
				if !slices.Contains(p.computeSlices(), cs.Slices) {
					return fmt.Errorf("GPU %s: compute instance of %d slices in a %s instance", d.uuid, cs.Slices, gs.Profile)
				}
				gi.addCI(cs.ID, cs.Start, cs.Slices, cs.UUID)
			}
			d.gis = append(d.gis, gi)
		}
	}
	return nil
}

// persistLocked writes the state through to the state file, if there is
// one; the caller holds f.mu. It is called after each change: a caller
// whose change could not be persisted undoes it and fails the NVML call
// with NVML_ERROR_UNKNOWN, so the file never lags behind what a caller
// was told.
func (f *fakeNVML) persistLocked() error {
	if f.stateFile == "" {
		return nil
	}
	data, err := json.MarshalIndent(f.snapshotLocked(), "", "  ")
	if err != nil {
		return err
	}
	data = append(data, '\n')
	if err := writeFileAtomic(f.stateFile, data); err != nil {
		return err
	}
	f.lastState = data
	return nil
}

// writeFileAtomic replaces path with data through a temporary file in the
// same directory: a reader, or a process started after a kill, sees the
// old content or the new, never a torn file. Not fsynced: the simulated
// state, like a GPU's, does not survive the machine.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }() // after a successful rename there is nothing left to remove
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// loadState starts the fake from its state file, or writes the file from
// the node's description when there is none yet, so that observers always
// find it. It runs before the fake is shared.
func (f *fakeNVML) loadState() error {
	if f.stateFile == "" {
		return nil
	}
	s, err := ReadState(f.stateFile)
	if err != nil {
		return err
	}
	if s == nil {
		return f.persistLocked()
	}
	if err := f.restore(s); err != nil {
		return fmt.Errorf("simulated hardware state %s: %w", f.stateFile, err)
	}
	// What the file holds now is what was restored (the next call takes in
	// only later changes of other processes).
	f.lastState, _ = json.MarshalIndent(f.snapshotLocked(), "", "  ")
	f.lastState = append(f.lastState, '\n')
	return nil
}

// Files of a simulated node's state directory (`gpudra kubelet-plugin
// --sim-state-dir`): the GPUs' NVML state ([WithStateFile]), the fake
// sysfs's kernel state ([Node.SysfsWithState]) and the GPUs' time slices
// (timeslice.LoadMemory).
const (
	NVMLStateFile       = "nvml.json"
	SysfsStateFile      = "sysfs.json"
	TimeSlicesStateFile = "timeslices.json"
)
