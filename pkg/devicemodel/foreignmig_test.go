package devicemodel_test

import (
	"slices"
	"testing"

	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// operatorLayoutFleet is a node migrated from another driver: an H100 in
// MIG mode holding an operator's layout, 1g.10gb at 0 and 3g.40gb at 4.
const operatorLayoutFleet = `
nodes:
- name: migrated-0
  gpus:
  - model: H100-SXM5-80GB
    migEnabled: true
    migDevices:
    - {profile: 1g.10gb, placementStart: 0}
    - {profile: 3g.40gb, placementStart: 4}
`

func operatorLayout(t *testing.T) *hardware.Inventory {
	t.Helper()
	f, err := simfleet.Parse([]byte(operatorLayoutFleet), "migrated")
	if err != nil {
		t.Fatal(err)
	}
	return discoverMIG(t, f, "migrated-0")
}

// foreignIf says which existing MIG devices are not gpudra's: those whose
// profile is listed.
func foreignIf(profiles ...string) devicemodel.Option {
	return devicemodel.WithForeignMIGDevices(func(_ *hardware.GPU, m *hardware.MIGDevice) bool {
		return slices.Contains(profiles, m.Profile)
	})
}

// TestForeignMIGDevicesArePublishedAsTheyAre: an operator's MIG devices on
// a GPU in dynamic MIG mode are published exactly as static MIG mode
// publishes them; no placement overlapping them is offered, every other
// one is; the counter set holds what they leave; the GPU is never offered
// whole.
func TestForeignMIGDevicesArePublishedAsTheyAre(t *testing.T) {
	inv := operatorLayout(t)
	gpu := inv.GPUs[0]
	static, err := devicemodel.Build(inv)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		opts    []devicemodel.Option
		foreign []string // profiles of the foreign devices
	}{
		{"both foreign", []devicemodel.Option{foreignIf("1g.10gb", "3g.40gb")}, []string{"1g.10gb", "3g.40gb"}},
		{"one foreign, one gpudra's", []devicemodel.Option{foreignIf("3g.40gb")}, []string{"3g.40gb"}},
		{"none foreign", []devicemodel.Option{foreignIf()}, nil},
		{"no ownership given", nil, nil},
		{"both foreign, mode switching", []devicemodel.Option{foreignIf("1g.10gb", "3g.40gb"),
			devicemodel.WithMIGModeSwitching(func(hardware.GPU) bool { return true })}, []string{"1g.10gb", "3g.40gb"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := devicemodel.Build(inv, append([]devicemodel.Option{devicemodel.WithDynamicMIG()}, tc.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := m.Lookup("gpu-0"); ok {
				t.Error("the full GPU is offered while it holds MIG devices")
			}
			var occupied []hardware.MIGDevice
			for _, mig := range gpu.MIGDevices {
				name := devicemodel.MIGName(gpu.Minor, mig.Profile, mig.ProfileID, mig.PlacementStart)
				d, ok := m.Lookup(name)
				if !ok {
					t.Errorf("%s not published", name)
					continue
				}
				if !slices.Contains(tc.foreign, mig.Profile) {
					if d.Placement == nil || d.MIG == nil || d.MIG.UUID != mig.UUID {
						t.Errorf("gpudra's %s: placement %v, MIG %v; want the placement holding %s", name, d.Placement, d.MIG, mig.UUID)
					}
					continue
				}
				occupied = append(occupied, mig)
				want, _ := static.Lookup(name)
				if d.Placement != nil || d.MIG == nil || !equalYAML(t, d.API, want.API) {
					t.Errorf("foreign %s is not published as static MIG publishes it:\ngot  %+v\nwant %+v", name, d.API, want.API)
				}
			}
			overlaps := func(start, size int) bool {
				return slices.ContainsFunc(occupied, func(o hardware.MIGDevice) bool {
					return start < o.PlacementStart+o.PlacementSize && o.PlacementStart < start+size
				})
			}
			for _, p := range gpu.MIGProfiles {
				for _, start := range p.PlacementStarts {
					name := devicemodel.MIGName(gpu.Minor, p.Name, p.ProfileID, start)
					d, ok := m.Lookup(name)
					switch {
					case overlaps(start, p.PlacementSize) && ok && d.Placement != nil:
						t.Errorf("placement %s overlaps a foreign MIG device and is offered", name)
					case !overlaps(start, p.PlacementSize) && (!ok || d.Placement == nil):
						t.Errorf("placement %s overlaps no foreign MIG device and is not offered", name)
					}
				}
			}
			if len(m.CounterSets) != 1 {
				t.Fatalf("%d counter sets, want 1", len(m.CounterSets))
			}
			got := counterValues(m.CounterSets[0].Counters)
			want := map[string]int64{}
			for name, v := range counterValues(buildDynamic(t, inventoryOf(simGPU(t, 0, "H100-SXM5-80GB", false))).CounterSets[0].Counters) {
				want[name] = v
			}
			for _, o := range occupied {
				want[devicemodel.CounterMemory] -= int64(o.MemoryBytes)
				want[devicemodel.CounterMultiprocessors] -= int64(o.Multiprocessors)
				want[devicemodel.CounterCopyEngines] -= int64(o.CopyEngines)
				want[devicemodel.CounterDecoders] -= int64(o.Decoders)
				want[devicemodel.CounterEncoders] -= int64(o.Encoders)
				want[devicemodel.CounterJPEGEngines] -= int64(o.JPEGEngines)
				want[devicemodel.CounterOFAEngines] -= int64(o.OFAEngines)
				for s := o.PlacementStart; s < o.PlacementStart+o.PlacementSize; s++ {
					want[devicemodel.MemorySliceCounter(s)] = 0
				}
			}
			for name, v := range want {
				if got[name] != max(v, 0) {
					t.Errorf("counter %s = %d, want %d", name, got[name], max(v, 0))
				}
			}
			for _, err := range validatePool(m.Slices()) {
				t.Errorf("published slices: %v", err)
			}
		})
	}
}

// TestForeignMIGDevicesNeverCollide runs the scheduler's allocator over a
// GPU holding an operator's layout: each profile is allocated until
// nothing fits, and no allocation may overlap the operator's devices or
// another allocation. The operator's 1g.10gb is handed out as the static
// device it is.
func TestForeignMIGDevicesNeverCollide(t *testing.T) {
	inv := operatorLayout(t)
	gpu := inv.GPUs[0]
	for profile, want := range map[string]int{
		"1g.10gb": 4, // the operator's at 0, placements 1, 2 and 3
		"2g.20gb": 1, // only at 2
		"3g.40gb": 1, // the operator's at 4
		"4g.40gb": 0,
		"7g.80gb": 0,
	} {
		t.Run(profile, func(t *testing.T) {
			forEachAllocator(t, func(t *testing.T, features structured.Features) {
				n := newShareNode(t, features, inv, devicemodel.WithDynamicMIG(), foreignIf("1g.10gb", "3g.40gb"))
				used := uint64(0)
				for _, o := range gpu.MIGDevices {
					used |= rangeMask(o.PlacementStart, o.PlacementSize)
				}
				got := 0
				for range 10 {
					res := n.allocate(n.claim(migTemplate(profile)))
					if res == nil {
						break
					}
					got++
					d, _ := n.model.Lookup(res.Devices.Results[0].Device)
					if d.Placement == nil {
						if d.MIG == nil || d.MIG.Profile != profile {
							t.Fatalf("allocated %s, not a %s", d.Name(), profile)
						}
						continue // an operator's device, used as it is
					}
					mask := rangeMask(d.Placement.Start, d.Placement.Profile.PlacementSize)
					if used&mask != 0 {
						t.Fatalf("allocation %d: %s overlaps an existing or allocated MIG device (slices %08b, used %08b)", got, d.Name(), mask, used)
					}
					used |= mask
				}
				if got != want {
					t.Errorf("%d %s devices allocated, want %d", got, profile, want)
				}
			})
		})
	}
}
