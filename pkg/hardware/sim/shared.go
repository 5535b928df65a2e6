package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"

	"github.com/gpudra/gpudra/internal/lockedfile"
)

// Several processes may drive one state file, as two plugin instances of
// a rolling update drive one node's GPUs: every call of the fake takes a
// lock on the file (flock(2) on <file>.lock) beside its own mutex, and
// first takes in what another process changed since it last read or
// wrote the file. Objects the file still has keep their handles; GPU and
// compute instances it no longer has are destroyed, so that a handle to
// one fails as NVML fails a handle to an instance another process
// destroyed.

// lock takes the fake's lock, in this process and, with a state file,
// across the processes sharing it, and brings the fake up to the file.
// It returns the function that releases it. A file that cannot be locked
// or read leaves the fake as it was: its next change still writes
// through, so observers see what it did.
func (f *fakeNVML) lock() (unlock func()) {
	f.mu.Lock()
	if f.stateFile == "" {
		return f.mu.Unlock
	}
	release, err := lockedfile.Exclusive(f.stateFile + ".lock")
	if err != nil {
		return f.mu.Unlock
	}
	_ = f.syncLocked()
	return func() {
		release()
		f.mu.Unlock()
	}
}

// syncLocked takes in the state file when it changed since this process
// last read or wrote it; the caller holds the lock.
func (f *fakeNVML) syncLocked() error {
	data, err := os.ReadFile(f.stateFile)
	if err != nil || bytes.Equal(data, f.lastState) {
		return err
	}
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return err
	}
	if s.Version != stateVersion || len(s.GPUs) != len(f.devices) {
		return fmt.Errorf("simulated hardware state %s: version %q with %d GPUs", f.stateFile, s.Version, len(s.GPUs))
	}
	for _, d := range f.devices {
		if _, ok := s.GPUs[d.uuid]; !ok {
			return fmt.Errorf("simulated hardware state %s: no GPU %s", f.stateFile, d.uuid)
		}
	}
	f.created = s.Created
	for _, d := range f.devices {
		d.apply(s.GPUs[d.uuid])
	}
	f.lastState = data
	return nil
}

// apply makes the GPU what g says, keeping the GPU and compute instances
// (and MIG devices) that g still has.
func (d *fakeDevice) apply(g GPUState) {
	d.minor, d.migEnabled, d.migPending = g.Minor, g.MIGEnabled, g.MIGPending
	oldMIGs := d.migs
	var gis []*fakeGI
	var migs []*fakeMIG
	for _, gs := range g.GPUInstances {
		p, ok := d.model.profile(gs.Profile)
		if !ok {
			continue
		}
		i := slices.IndexFunc(d.gis, func(gi *fakeGI) bool {
			return gi.start == gs.Start && gi.profile.Name == gs.Profile && gi.id == gs.ID
		})
		var gi *fakeGI
		if i >= 0 {
			gi = d.gis[i]
		} else {
			gi = d.newGI(p, gs.Start)
		}
		var cis []*fakeCI
		for _, cs := range gs.ComputeInstances {
			j := slices.IndexFunc(gi.cis, func(ci *fakeCI) bool {
				return ci.id == cs.ID && ci.start == cs.Start && ci.slices == cs.Slices && d.migUUID(ci) == cs.UUID
			})
			var ci *fakeCI
			if j >= 0 {
				ci = gi.cis[j]
			} else {
				ci = &fakeCI{gi: gi, id: cs.ID, start: cs.Start, slices: cs.Slices, profile: p.ciProfile(cs.Slices)}
			}
			cis = append(cis, ci)
			k := slices.IndexFunc(oldMIGs, func(m *fakeMIG) bool { return m.ci == ci })
			if k >= 0 {
				migs = append(migs, oldMIGs[k])
			} else {
				migs = append(migs, &fakeMIG{gi: gi, ci: ci, uuid: cs.UUID})
			}
		}
		for _, ci := range gi.cis {
			if !slices.Contains(cis, ci) {
				ci.destroyed = true
			}
		}
		gi.cis = cis
		gis = append(gis, gi)
	}
	for _, gi := range d.gis {
		if !slices.Contains(gis, gi) {
			gi.destroyed = true
			for _, ci := range gi.cis {
				ci.destroyed = true
			}
		}
	}
	d.gis, d.migs = gis, migs
}
