package sim

import (
	"fmt"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The calls that change MIG state. They answer as nvml.h documents:
// NVML_ERROR_NOT_SUPPORTED for GPU instance calls with MIG mode off,
// NVML_ERROR_INVALID_ARGUMENT for a profile or placement the GPU does not
// offer and for handles of destroyed instances,
// NVML_ERROR_INSUFFICIENT_RESOURCES when an instance does not fit, and
// NVML_ERROR_IN_USE for a GPU instance that still holds compute instances.
// With a state file ([WithStateFile]) each change is written through
// before the call returns; one that cannot be written is undone and the
// call answers NVML_ERROR_UNKNOWN.

// overlaps reports whether memory slices [start, start+size) hold a GPU
// instance; the caller holds nv.mu.
func (d *fakeDevice) overlaps(start, size int) bool {
	for _, gi := range d.gis {
		if start < gi.start+gi.profile.PlacementSize && gi.start < start+size {
			return true
		}
	}
	return false
}

// instancesOf counts the GPU instances of profile p; the caller holds
// nv.mu.
func (d *fakeDevice) instancesOf(p *MIGProfile) int {
	n := 0
	for _, gi := range d.gis {
		if gi.profile == p {
			n++
		}
	}
	return n
}

// profiles lists the profiles of the GPU's GPU instances; the caller
// holds nv.mu.
func (d *fakeDevice) profiles() []*MIGProfile {
	out := make([]*MIGProfile, len(d.gis))
	for i, gi := range d.gis {
		out[i] = gi.profile
	}
	return out
}

// CreateGpuInstanceWithPlacement implements nvml.Device.
func (d *fakeDevice) CreateGpuInstanceWithPlacement(info *nvml.GpuInstanceProfileInfo, placement *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
	if ret := d.hit("nvmlDeviceCreateGpuInstanceWithPlacement"); ret != nvml.SUCCESS {
		return nil, ret
	}
	defer d.nv.lock()()
	if !d.migCapable() || !d.migEnabled {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	p, ok := d.profileOf(info)
	if !ok || placement == nil || int(placement.Size) != p.PlacementSize || !slices.Contains(p.PlacementStarts, int(placement.Start)) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	start := int(placement.Start)
	if d.overlaps(start, p.PlacementSize) || d.instancesOf(p) >= p.Instances || d.model.engineShortfall(append(d.profiles(), p)) != "" {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	gi := d.newGI(p, start)
	d.gis = append(d.gis, gi)
	if d.nv.persistLocked() != nil {
		d.gis = d.gis[:len(d.gis)-1]
		return nil, nvml.ERROR_UNKNOWN
	}
	return gi, nvml.SUCCESS
}

// GetGpuInstanceRemainingCapacity implements nvml.Device: how many more
// instances of the profile fit beside the existing ones.
func (d *fakeDevice) GetGpuInstanceRemainingCapacity(info *nvml.GpuInstanceProfileInfo) (int, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetGpuInstanceRemainingCapacity"); ret != nvml.SUCCESS {
		return 0, ret
	}
	defer d.nv.lock()()
	if !d.migCapable() || !d.migEnabled {
		return 0, nvml.ERROR_NOT_SUPPORTED
	}
	p, ok := d.profileOf(info)
	if !ok {
		return 0, nvml.ERROR_INVALID_ARGUMENT
	}
	// Placements are aligned blocks of one size, so taking every free one
	// in order never blocks a better choice. Each must also find the
	// engines it needs beside the others.
	free := 0
	taken := -1 // end of the last placement counted
	held := d.profiles()
	for _, s := range p.PlacementStarts {
		if s >= taken && !d.overlaps(s, p.PlacementSize) && d.model.engineShortfall(append(held, p)) == "" {
			free++
			taken = s + p.PlacementSize
			held = append(held, p)
		}
	}
	return min(free, p.Instances-d.instancesOf(p)), nvml.SUCCESS
}

// SetMigMode implements nvml.Device, returning the activation status and
// the call's result. A GPU switches off only without GPU instances
// (NVML_ERROR_IN_USE otherwise). Hopper and newer switch at once, and a
// GPU may come back with another minor (see [WithMinorAfterMIGModeSwitch]);
// an A100 records the mode as pending and answers
// NVML_ERROR_RESET_REQUIRED, as A100s do where the driver cannot reset
// them in place; the simulation never resets them.
func (d *fakeDevice) SetMigMode(mode int) (nvml.Return, nvml.Return) {
	if ret := d.hit("nvmlDeviceSetMigMode"); ret != nvml.SUCCESS {
		return nvml.SUCCESS, ret
	}
	defer d.nv.lock()()
	switch {
	case !d.migCapable():
		return nvml.SUCCESS, nvml.ERROR_NOT_SUPPORTED
	case mode != nvml.DEVICE_MIG_ENABLE && mode != nvml.DEVICE_MIG_DISABLE:
		return nvml.SUCCESS, nvml.ERROR_INVALID_ARGUMENT
	case mode == nvml.DEVICE_MIG_DISABLE && len(d.gis) > 0:
		return nvml.SUCCESS, nvml.ERROR_IN_USE
	}
	enabled := mode == nvml.DEVICE_MIG_ENABLE
	was := struct {
		enabled, pending bool
		minor            int
	}{d.migEnabled, d.migPending, d.minor}
	activation := nvml.SUCCESS
	d.migPending = enabled
	switch {
	case d.migEnabled == enabled:
	case d.model.Architecture == nvml.DEVICE_ARCH_AMPERE:
		activation = nvml.ERROR_RESET_REQUIRED
	default:
		d.migEnabled = enabled
		if minor, ok := d.nv.minorsAfterSwitch[d.uuid]; ok {
			d.minor = minor
		}
	}
	if d.nv.persistLocked() != nil {
		d.migEnabled, d.migPending, d.minor = was.enabled, was.pending, was.minor
		return nvml.SUCCESS, nvml.ERROR_UNKNOWN
	}
	return activation, nvml.SUCCESS
}

// CreateComputeInstance implements nvml.GpuInstance. The new compute
// instance takes the lowest free ID and the first free aligned run of
// compute slices; its MIG device gets a UUID no earlier one had.
func (gi *fakeGI) CreateComputeInstance(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
	d := gi.parent
	if ret := d.hit("nvmlGpuInstanceCreateComputeInstance"); ret != nvml.SUCCESS {
		return nil, ret
	}
	defer d.nv.lock()()
	if gi.destroyed || info == nil {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	i := slices.IndexFunc(gi.profile.computeSlices(), func(c int) bool { return gi.profile.ciProfile(c) == int(info.Id) })
	if i < 0 {
		return nil, nvml.ERROR_NOT_SUPPORTED
	}
	c := gi.profile.computeSlices()[i]
	used := make([]bool, gi.profile.Slices)
	ids := map[int]bool{}
	for _, ci := range gi.cis {
		for s := ci.start; s < ci.start+ci.slices; s++ {
			used[s] = true
		}
		ids[ci.id] = true
	}
	start := -1
	for s := 0; s+c <= gi.profile.Slices && start < 0; s += c {
		if !slices.Contains(used[s:s+c], true) {
			start = s
		}
	}
	if start < 0 {
		return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
	}
	id := 0
	for ids[id] {
		id++
	}
	d.nv.created++
	uuid := "MIG-" + nameUUID(fmt.Sprintf("mig/%s/%d/created/%d", d.nv.node, d.index, d.nv.created))
	ci := gi.addCI(id, start, c, uuid)
	if d.nv.persistLocked() != nil {
		gi.cis = gi.cis[:len(gi.cis)-1]
		d.removeMIG(ci)
		d.nv.created--
		return nil, nvml.ERROR_UNKNOWN
	}
	return ci, nvml.SUCCESS
}

// Destroy implements nvml.GpuInstance.
func (gi *fakeGI) Destroy() nvml.Return {
	d := gi.parent
	if ret := d.hit("nvmlGpuInstanceDestroy"); ret != nvml.SUCCESS {
		return ret
	}
	defer d.nv.lock()()
	switch {
	case gi.destroyed:
		return nvml.ERROR_INVALID_ARGUMENT
	case len(gi.cis) > 0:
		return nvml.ERROR_IN_USE
	}
	i := slices.Index(d.gis, gi)
	gi.destroyed = true
	d.gis = slices.Delete(d.gis, i, i+1)
	if d.nv.persistLocked() != nil {
		gi.destroyed = false
		d.gis = slices.Insert(d.gis, i, gi)
		return nvml.ERROR_UNKNOWN
	}
	return nvml.SUCCESS
}

// Destroy implements nvml.ComputeInstance.
func (ci *fakeCI) Destroy() nvml.Return {
	d := ci.gi.parent
	if ret := d.hit("nvmlComputeInstanceDestroy"); ret != nvml.SUCCESS {
		return ret
	}
	defer d.nv.lock()()
	if ci.destroyed {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	i := slices.Index(ci.gi.cis, ci)
	j := slices.IndexFunc(d.migs, func(m *fakeMIG) bool { return m.ci == ci })
	mig := d.migs[j]
	ci.destroyed = true
	ci.gi.cis = slices.Delete(ci.gi.cis, i, i+1)
	d.migs = slices.Delete(d.migs, j, j+1)
	if d.nv.persistLocked() != nil {
		ci.destroyed = false
		ci.gi.cis = slices.Insert(ci.gi.cis, i, ci)
		d.migs = slices.Insert(d.migs, j, mig)
		return nvml.ERROR_UNKNOWN
	}
	return nvml.SUCCESS
}
