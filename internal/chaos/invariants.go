package chaos

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/features/dynamicmig"
	"github.com/gpudra/gpudra/pkg/features/mps"
	"github.com/gpudra/gpudra/pkg/features/timeslicing"
	"github.com/gpudra/gpudra/pkg/features/vfio"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
)

// The invariants. Each check returns the violations it finds, one line
// each, starting with the invariant's name.
//
//   - exclusive: no device in two live claims, by checkpoint records and
//     by CDI specs: a device held by several claims only as shares (each
//     with its own share ID), and no counter set of the published pool
//     used beyond its capacity by the devices held (a full GPU, its VFIO
//     device and its MIG devices share one set; MIG placements share its
//     memory slices). The same by what the devices are: no GPU (by UUID)
//     and no MIG instance (by placement and UUID) prepared for two claims
//     at once, by the checkpoint's devices and dynamic-MIG records and by
//     the device identities and records the specs carry.
//   - owned: no checkpoint entry, CDI spec, MIG instance, VFIO binding,
//     time slice other than Default, or MPS daemon that no live claim
//     owns (a live claim: allocated and not yet unprepared).
//   - intact: every claim whose Prepare succeeded, and that the kubelet
//     has not started to unprepare, is recorded as completed with its
//     allocated devices; its CDI spec names the devices the Prepare
//     returned, with /dev/nvidia<minor> of their GPU (none for VFIO), the
//     VFIO nodes of a passed-through GPU bound to vfio-pci, MIG devices
//     that exist, a live MPS daemon whose pipe directory it mounts, and
//     the time slice it asked for in force.
//   - exists: a prepared claim's CDI spec names only devices that exist:
//     published ones, whose GPU or MIG device is on the hardware.
//   - clean (at the end): nothing at all is left.
//
// While the checkpoint is lost (observed.lost) only what the CDI specs say
// is checked: the plugin adopts them before it serves anything.

// liveClaims are the claims the harness has allocated and not yet seen
// unprepared, by UID.
type liveClaims map[types.UID]*claim

func (o *observed) check(live liveClaims, final bool) []string {
	var v []string
	v = append(v, o.exclusive()...)
	v = append(v, o.owned(live)...)
	v = append(v, o.intact(live)...)
	v = append(v, o.exists(live)...)
	if final {
		v = append(v, o.clean()...)
	}
	return v
}

// holder is one claim's hold on a device.
type holder struct{ claim, shareID string }

// exclusive checks the holds of the checkpoint and of the CDI specs.
func (o *observed) exclusive() []string {
	fromCkpt := map[string][]holder{}
	for uid, c := range o.claims {
		for _, d := range c.Devices {
			if !d.AdminAccess {
				fromCkpt[d.Name] = append(fromCkpt[d.Name], holder{uid, d.ShareID})
			}
		}
	}
	fromSpecs := map[string][]holder{}
	for uid, s := range o.specs {
		for _, name := range s.content.DeviceNames {
			device, share := cdi.SplitDeviceName(name)
			fromSpecs[device] = append(fromSpecs[device], holder{uid, share})
		}
	}
	var v []string
	for source, holds := range map[string]map[string][]holder{"checkpoint": fromCkpt, "CDI specs": fromSpecs} {
		v = append(v, o.exclusiveHolds(source, holds)...)
	}
	v = append(v, o.exclusiveHardware()...)
	return v
}

// exclusiveHardware checks that no GPU and no MIG instance is prepared for
// two claims, by what they are rather than by the published names: the
// UUIDs of the devices held (a GPU held whole, or as shares with distinct
// share IDs) and the MIG instances the dynamic-MIG records own.
func (o *observed) exclusiveHardware() []string {
	type source struct {
		byUUID map[string][]holder
		migs   map[string][]string // "<GPU> <profile>@<start>" -> claims
	}
	newSource := func() *source { return &source{byUUID: map[string][]holder{}, migs: map[string][]string{}} }
	ckpt, specs := newSource(), newSource()
	addMIGs := func(src *source, uid string, raw json.RawMessage) {
		var r dynamicmig.Record
		if json.Unmarshal(raw, &r) != nil {
			return
		}
		for _, in := range r.Devices {
			key := fmt.Sprintf("%s %s@%d", in.ParentUUID, in.Profile, in.Start)
			if !slices.Contains(src.migs[key], uid) {
				src.migs[key] = append(src.migs[key], uid)
			}
		}
	}
	for uid, c := range o.claims {
		for _, d := range c.Devices {
			if d.UUID != "" && !d.AdminAccess {
				ckpt.byUUID[d.UUID] = append(ckpt.byUUID[d.UUID], holder{uid, d.ShareID})
			}
		}
		if raw, ok := c.Records[dynamicmig.Name]; ok {
			addMIGs(ckpt, uid, raw)
		}
	}
	for uid, s := range o.specs {
		for _, d := range s.content.Devices {
			if d.UUID != "" {
				specs.byUUID[d.UUID] = append(specs.byUUID[d.UUID], holder{uid, d.ShareID})
			}
		}
		if raw, ok := s.content.Records[dynamicmig.Name]; ok {
			addMIGs(specs, uid, raw)
		}
	}
	var v []string
	for name, src := range map[string]*source{"checkpoint": ckpt, "CDI specs": specs} {
		for _, uuid := range slices.Sorted(maps.Keys(src.byUUID)) {
			claims, shares := map[string]bool{}, map[string]bool{}
			for _, h := range src.byUUID[uuid] {
				claims[h.claim] = true
				if h.shareID == "" || shares[h.shareID] {
					shares[""] = true
				}
				shares[h.shareID] = true
			}
			if len(claims) > 1 && shares[""] {
				v = append(v, fmt.Sprintf("exclusive: %s: %s prepared for claims %v, not all as distinct shares", name, uuid, slices.Sorted(maps.Keys(claims))))
			}
		}
		for _, key := range slices.Sorted(maps.Keys(src.migs)) {
			if claims := src.migs[key]; len(claims) > 1 {
				slices.Sort(claims)
				v = append(v, fmt.Sprintf("exclusive: %s: MIG instance %s owned by claims %v", name, key, claims))
			}
		}
	}
	return v
}

func (o *observed) exclusiveHolds(source string, holds map[string][]holder) []string {
	var v []string
	used := map[string]map[string]int64{}
	for _, device := range slices.Sorted(maps.Keys(holds)) {
		hs := holds[device]
		claims := map[string]bool{}
		shares := map[string]bool{}
		for _, h := range hs {
			claims[h.claim] = true
			if h.shareID == "" || shares[h.shareID] {
				shares[""] = true // an exclusive hold, or a share held twice
			}
			shares[h.shareID] = true
		}
		if len(claims) > 1 && shares[""] {
			v = append(v, fmt.Sprintf("exclusive: %s: device %s held by claims %v, not all as distinct shares", source, device, slices.Sorted(maps.Keys(claims))))
		}
		// A shared device's counters are charged once, as the scheduler
		// charges them.
		if p := o.devices[device]; p != nil {
			for _, c := range p.consumes {
				if used[c.CounterSet] == nil {
					used[c.CounterSet] = map[string]int64{}
				}
				for name, q := range c.Counters {
					used[c.CounterSet][name] += q.Value.Value()
				}
			}
		}
	}
	for set, counters := range used {
		for name, n := range counters {
			if capacity, ok := o.sets[set][name]; ok && n > capacity {
				v = append(v, fmt.Sprintf("exclusive: %s: counter %s/%s used %d times its capacity %d by the devices held", source, set, name, n, capacity))
			}
		}
	}
	return v
}

// records decodes one record of a checkpoint claim; false when it has none.
func record[T any](c *ckptClaim, name string) (T, bool, error) {
	var r T
	raw, ok := c.Records[name]
	if !ok {
		return r, false, nil
	}
	return r, true, json.Unmarshal(raw, &r)
}

// owned checks that everything on the node belongs to a live claim.
func (o *observed) owned(live liveClaims) []string {
	var v []string
	isLive := func(uid string) bool { return live[types.UID(uid)] != nil }
	for uid, c := range o.claims {
		if !isLive(uid) {
			v = append(v, fmt.Sprintf("owned: checkpoint entry %s (%s) for a claim that is gone", uid, c.Phase))
		}
	}
	for uid := range o.specs {
		if !isLive(uid) {
			v = append(v, fmt.Sprintf("owned: CDI spec for claim %s, which is gone", uid))
		}
	}
	// What the records of live claims own.
	type placement struct {
		gpu, profile string
		start        int
	}
	migs, vfioFuncs, daemons := map[placement]bool{}, map[string]bool{}, map[string]bool{}
	holds := map[string][]v1beta1.TimeSliceInterval{}
	for uid, c := range o.claims {
		if !isLive(uid) {
			continue
		}
		if r, ok, err := record[dynamicmig.Record](c, dynamicmig.Name); err != nil {
			v = append(v, fmt.Sprintf("owned: claim %s: %s record: %v", uid, dynamicmig.Name, err))
		} else if ok {
			for _, in := range r.Devices {
				migs[placement{in.ParentUUID, in.Profile, in.Start}] = true
			}
		}
		if r, ok, err := record[vfio.Record](c, vfio.Name); err != nil {
			v = append(v, fmt.Sprintf("owned: claim %s: %s record: %v", uid, vfio.Name, err))
		} else if ok {
			for _, p := range r.Devices {
				for _, f := range p.Functions {
					vfioFuncs[f.BusID] = true
				}
			}
		}
		if r, ok, err := record[timeslicing.Record](c, timeslicing.Name); err != nil {
			v = append(v, fmt.Sprintf("owned: claim %s: %s record: %v", uid, timeslicing.Name, err))
		} else if ok {
			for _, h := range r.GPUs {
				holds[h.GPU] = append(holds[h.GPU], h.Interval)
			}
		}
		if r, ok, err := record[mps.Record](c, mps.Name); err != nil {
			v = append(v, fmt.Sprintf("owned: claim %s: %s record: %v", uid, mps.Name, err))
		} else if ok {
			for _, d := range r.Daemons {
				daemons[d.ID] = true
			}
		}
	}
	if o.lost != "" {
		// The records are in the lost file, and in the specs until the
		// plugin adopts them.
		return v
	}
	if o.nvml != nil {
		for gpu, g := range o.nvml.GPUs {
			for _, gi := range g.GPUInstances {
				if !migs[placement{gpu, gi.Profile, gi.Start}] {
					v = append(v, fmt.Sprintf("owned: MIG instance %s at %d on GPU %s (MIG devices %v) is no live claim's", gi.Profile, gi.Start, gpu, ciUUIDs(gi.ComputeInstances)))
				}
			}
		}
	}
	if o.sysfs != nil {
		for busID, f := range o.sysfs.Functions {
			if (f.Driver != "nvidia" || f.Override != "") && !vfioFuncs[busID] {
				v = append(v, fmt.Sprintf("owned: PCI function %s bound to %q (driver_override %q) for no live claim", busID, f.Driver, f.Override))
			}
		}
	}
	for gpu, iv := range o.slices {
		if iv != v1beta1.DefaultTimeSlice && !slices.Contains(holds[gpu], iv) {
			v = append(v, fmt.Sprintf("owned: GPU %s time slice %s, held by no live claim (holds %v)", gpu, iv, holds[gpu]))
		}
	}
	for id, pids := range o.daemons {
		if !daemons[id] {
			v = append(v, fmt.Sprintf("owned: MPS daemon %s (pids %v) runs for no live claim", id, pids))
		}
	}
	return v
}

func ciUUIDs(cis []sim.ComputeInstanceState) []string {
	var out []string
	for _, ci := range cis {
		out = append(out, ci.UUID)
	}
	return out
}

// intact checks the claims whose Prepare succeeded and that the kubelet
// has not started to unprepare.
func (o *observed) intact(live liveClaims) []string {
	var v []string
	for _, uid := range slices.Sorted(maps.Keys(live)) {
		c := live[uid]
		if c.phase != phasePrepared || c.forced {
			continue // a force-deleted claim may be released by the sweep
		}
		fail := func(format string, args ...any) {
			v = append(v, fmt.Sprintf("intact: claim %s (%s): ", c.obj.Name, c.kind)+fmt.Sprintf(format, args...))
		}
		if o.lost != "" {
			if o.specs[string(uid)] == nil {
				fail("prepared, but it has no CDI spec (checkpoint lost: %s)", o.lost)
			}
			continue
		}
		rec := o.claims[string(uid)]
		if rec == nil || rec.Phase != "PrepareCompleted" {
			fail("prepared, but the checkpoint has %v", rec)
			continue
		}
		var want, got []string
		for _, r := range c.obj.Status.Allocation.Devices.Results {
			share := ""
			if r.ShareID != nil {
				share = string(*r.ShareID)
			}
			want = append(want, r.Device+"@"+share)
		}
		for _, d := range rec.Devices {
			got = append(got, d.Name+"@"+d.ShareID)
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(want, got) {
			fail("checkpoint records devices %v, allocated %v", got, want)
		}
		s := o.specs[string(uid)]
		if s == nil {
			fail("prepared, but it has no CDI spec")
			continue
		}
		v = append(v, o.specMatches(c, rec, s)...)
	}
	return v
}

// specMatches checks a prepared claim's spec against the hardware.
func (o *observed) specMatches(c *claim, rec *ckptClaim, s *spec) []string {
	var v []string
	fail := func(format string, args ...any) {
		v = append(v, fmt.Sprintf("intact: claim %s (%s): ", c.obj.Name, c.kind)+fmt.Sprintf(format, args...))
	}
	specDevices := map[string]*cdispec.Device{}
	for i := range s.raw.Devices {
		specDevices[s.raw.Devices[i].Name] = &s.raw.Devices[i]
	}
	prefix := cdi.Kind(driverName) + "="
	migRec, _, _ := record[dynamicmig.Record](rec, dynamicmig.Name)
	vfioRec, _, _ := record[vfio.Record](rec, vfio.Name)
	tsRec, _, _ := record[timeslicing.Record](rec, timeslicing.Name)
	mpsRec, hasMPS, _ := record[mps.Record](rec, mps.Name)
	for _, id := range c.cdiIDs {
		if strings.HasPrefix(id, driverName+"/metadata=") {
			// The helper's device metadata, in a spec of its own.
			if !o.metadata[id] {
				fail("Prepare returned the device metadata CDI device %s, which no metadata spec holds", id)
			}
			continue
		}
		name, ok := strings.CutPrefix(id, prefix)
		sd := specDevices[name]
		if !ok || sd == nil {
			fail("Prepare returned CDI device %s, which its spec lacks", id)
			continue
		}
		deviceName, _ := cdi.SplitDeviceName(strings.TrimPrefix(name, string(c.obj.UID)+"-"))
		p := o.devices[deviceName]
		if p == nil {
			fail("CDI device %s is for %s, which is not published", id, deviceName)
			continue
		}
		nodes := map[string]int64{}
		for _, dn := range append(slices.Clone(sd.ContainerEdits.DeviceNodes), s.raw.ContainerEdits.DeviceNodes...) {
			nodes[dn.Path] = dn.Minor
		}
		switch p.str("type") {
		case "gpu":
			if minor, ok := nodes[fmt.Sprintf("/dev/nvidia%d", p.int("minor"))]; !ok || minor != int64(p.int("minor")) {
				fail("device %s: spec lacks /dev/nvidia%d", deviceName, p.int("minor"))
			}
		case "mig":
			parent := p.str("parentUUID")
			if o.nvml == nil {
				fail("device %s: no simulated hardware state", deviceName)
				break
			}
			gpu := o.nvml.GPUs[parent]
			if _, ok := nodes[fmt.Sprintf("/dev/nvidia%d", gpu.Minor)]; !ok {
				fail("device %s: spec lacks /dev/nvidia%d of its GPU", deviceName, gpu.Minor)
			}
			i := slices.IndexFunc(migRec.Devices, func(in dynamicmig.Instance) bool { return in.Device == deviceName })
			if i < 0 || migRec.Devices[i].UUID == "" {
				fail("device %s: no created MIG device in its record", deviceName)
				break
			}
			in := migRec.Devices[i]
			if !slices.ContainsFunc(gpu.GPUInstances, func(gi sim.GPUInstanceState) bool {
				return gi.Start == in.Start && gi.Profile == in.Profile && slices.Contains(ciUUIDs(gi.ComputeInstances), in.UUID)
			}) {
				fail("device %s: MIG device %s (%s at %d) does not exist on GPU %s", deviceName, in.UUID, in.Profile, in.Start, parent)
			}
		case "vfio":
			for path := range nodes {
				if strings.HasPrefix(path, "/dev/nvidia") {
					fail("VFIO device %s: spec has %s", deviceName, path)
				}
			}
			busID := p.str("resource.kubernetes.io/pciBusID")
			i := slices.IndexFunc(vfioRec.Devices, func(d vfio.Passthrough) bool { return d.Device == deviceName })
			f, ok := o.sysfs.Functions[busID]
			switch {
			case i < 0:
				fail("VFIO device %s: not in its vfio record", deviceName)
			case !ok || f.Driver != vfioRec.Devices[i].Functions[0].Driver || f.VFIODev < 0:
				fail("VFIO device %s: GPU %s is bound to %q (VFIO device %d)", deviceName, busID, f.Driver, f.VFIODev)
			default:
				group := fmt.Sprintf("/dev/vfio/%d", vfioRec.Devices[i].IOMMUGroup)
				cdev := fmt.Sprintf("/dev/vfio/devices/vfio%d", f.VFIODev)
				_, hasGroup := nodes[group]
				_, hasCdev := nodes[cdev]
				if !hasGroup && !hasCdev {
					fail("VFIO device %s: spec has neither %s nor %s (nodes %v)", deviceName, group, cdev, slices.Sorted(maps.Keys(nodes)))
				}
			}
		}
	}
	for _, h := range tsRec.GPUs {
		if got, ok := o.slices[h.GPU]; !ok || got != h.Interval {
			fail("GPU %s time slice %q, the claim holds %s", h.GPU, got, h.Interval)
		}
	}
	if hasMPS {
		for _, d := range mpsRec.Daemons {
			if len(o.daemons[d.ID]) == 0 {
				fail("MPS daemon %s does not run", d.ID)
			}
			if !mountsPipe(s.raw, d.ID) {
				fail("spec does not mount the pipe directory of MPS daemon %s", d.ID)
			}
		}
	}
	return v
}

// exists checks that the CDI specs of prepared claims name only devices
// that exist, by the device identities the specs carry, so also while the
// checkpoint is lost. A prepared claim: one whose Prepare succeeded and
// that the kubelet has not started to unprepare (an interrupted Unprepare
// may have destroyed its MIG device already, and the sweep may release a
// force-deleted one).
func (o *observed) exists(live liveClaims) []string {
	var v []string
	for _, uid := range slices.Sorted(maps.Keys(o.specs)) {
		if c := live[types.UID(uid)]; c == nil || c.phase != phasePrepared || c.forced {
			continue
		}
		s := o.specs[uid]
		fail := func(format string, args ...any) {
			v = append(v, fmt.Sprintf("exists: claim %s: its CDI spec ", uid)+fmt.Sprintf(format, args...))
		}
		for _, name := range s.content.DeviceNames {
			device, _ := cdi.SplitDeviceName(name)
			if o.devices[device] == nil {
				fail("names device %s, which is not published", device)
			}
		}
		if o.nvml == nil {
			continue
		}
		for _, d := range s.content.Devices {
			if d.UUID == "" || o.devices[d.Name] == nil {
				continue
			}
			switch t := o.devices[d.Name].str("type"); {
			case t == "mig":
				gpu, ok := o.nvml.GPUs[d.ParentUUID]
				if !ok || !slices.ContainsFunc(gpu.GPUInstances, func(gi sim.GPUInstanceState) bool {
					return slices.Contains(ciUUIDs(gi.ComputeInstances), d.UUID)
				}) {
					fail("names MIG device %s (%s on GPU %s), which does not exist", d.Name, d.UUID, d.ParentUUID)
				}
			case d.ParentUUID == "":
				if _, ok := o.nvml.GPUs[d.UUID]; !ok {
					fail("names device %s (%s), which is no GPU of the node", d.Name, d.UUID)
				}
			}
		}
	}
	return v
}

// mountsPipe reports whether the spec mounts the pipe directory of the
// daemon with the given ID, for the claim or for one of its devices.
func mountsPipe(s *cdispec.Spec, id string) bool {
	edits := []cdispec.ContainerEdits{s.ContainerEdits}
	for _, d := range s.Devices {
		edits = append(edits, d.ContainerEdits)
	}
	for _, e := range edits {
		for _, m := range e.Mounts {
			if strings.HasSuffix(m.HostPath, "/"+id+"/pipe") {
				return true
			}
		}
	}
	return false
}

// clean checks that nothing is left once every claim was unprepared.
func (o *observed) clean() []string {
	var v []string
	if len(o.claims) > 0 {
		v = append(v, fmt.Sprintf("clean: checkpoint still holds %d claims", len(o.claims)))
	}
	if len(o.specs) > 0 {
		v = append(v, fmt.Sprintf("clean: %d CDI specs left", len(o.specs)))
	}
	if o.nvml != nil {
		for gpu, g := range o.nvml.GPUs {
			if len(g.GPUInstances) > 0 {
				v = append(v, fmt.Sprintf("clean: GPU %s has %d MIG instances", gpu, len(g.GPUInstances)))
			}
		}
	}
	if o.sysfs != nil {
		for busID, f := range o.sysfs.Functions {
			if f.Driver != "nvidia" || f.Override != "" {
				v = append(v, fmt.Sprintf("clean: PCI function %s bound to %q, driver_override %q", busID, f.Driver, f.Override))
			}
		}
	}
	for gpu, iv := range o.slices {
		if iv != v1beta1.DefaultTimeSlice {
			v = append(v, fmt.Sprintf("clean: GPU %s left at time slice %s", gpu, iv))
		}
	}
	for id, pids := range o.daemons {
		v = append(v, fmt.Sprintf("clean: MPS daemon %s still runs (pids %v)", id, pids))
	}
	return v
}
