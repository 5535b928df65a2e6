package devicemodel_test

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// dgxH100MIGFleet is a DGX H100 with MIG mode on on every GPU. Two GPUs
// hold MIG devices already, which must not change what is published.
const dgxH100MIGFleet = `
nodes:
- name: dgx-h100-mig-0
  gpus:
  - model: H100-SXM5-80GB
    migEnabled: true
    migDevices:
    - {profile: 3g.40gb, placementStart: 4}
    - {profile: 1g.10gb, placementStart: 0}
  - {model: H100-SXM5-80GB, migEnabled: true}
  - {model: H100-SXM5-80GB, migEnabled: true}
  - {model: H100-SXM5-80GB, migEnabled: true}
  - {model: H100-SXM5-80GB, migEnabled: true}
  - {model: H100-SXM5-80GB, migEnabled: true}
  - {model: H100-SXM5-80GB, migEnabled: true}
  - model: H100-SXM5-80GB
    migEnabled: true
    migDevices:
    - {profile: 7g.80gb}
`

// mixedMIGFleet is a node with an H100 in MIG mode, one not, and an L40S,
// which has no MIG.
const mixedMIGFleet = `
nodes:
- name: mixed-0
  gpus:
  - model: H100-SXM5-80GB
    migEnabled: true
    migDevices:
    - {profile: 2g.20gb, placementStart: 0}
  - model: H100-SXM5-80GB
  - model: L40S
`

// gh200MIGFleet is a GH200 NVL32 node (one GH200 96GB) in MIG mode, with
// one MIG device of the profile with media extensions.
const gh200MIGFleet = `
nodes:
- name: gh200-mig-0
  fabric: {cliqueID: 1}
  gpus:
  - model: GH200-96GB
    migEnabled: true
    migDevices:
    - {profile: 1g.12gb+me, placementStart: 6}
`

// goldenSlice is one published slice as it appears in a ResourceSlice's
// spec.
type goldenSlice struct {
	SharedCounters []resourceapi.CounterSet `json:"sharedCounters,omitempty"`
	Devices        []resourceapi.Device     `json:"devices,omitempty"`
}

var dynamicGoldenCases = []struct {
	golden string
	fleet  func(*testing.T) *simfleet.Fleet
	node   string
}{
	{"dgx-h100-dynamic-mig", parsed(dgxH100MIGFleet), "dgx-h100-mig-0"},
	{"mixed-dynamic-mig", parsed(mixedMIGFleet), "mixed-0"},
	{"gh200-dynamic-mig", parsed(gh200MIGFleet), "gh200-mig-0"},
}

// TestGoldenDynamicMIG pins the slices of dynamic-MIG nodes, counter sets
// and devices, byte for byte. Run with -update to rewrite the files, then
// read the diff; TestDynamicMIGModels checks the figures independently.
func TestGoldenDynamicMIG(t *testing.T) {
	for _, tc := range dynamicGoldenCases {
		t.Run(tc.golden, func(t *testing.T) {
			m := buildDynamic(t, discoverMIG(t, tc.fleet(t), tc.node))
			var out []goldenSlice
			for _, s := range m.Slices() {
				out = append(out, goldenSlice{SharedCounters: s.SharedCounters, Devices: s.Devices})
			}
			checkGolden(t, tc.golden, "slices", out)
		})
	}
}

// TestDynamicMIGNodes checks what the golden nodes are made of: which GPUs
// get counter sets, which devices they get, and which devices stand for
// MIG devices that exist.
func TestDynamicMIGNodes(t *testing.T) {
	t.Run("dgx-h100-dynamic-mig", func(t *testing.T) {
		inv := discoverMIG(t, parsed(dgxH100MIGFleet)(t), "dgx-h100-mig-0")
		m := buildDynamic(t, inv)
		if len(m.CounterSets) != 8 {
			t.Errorf("%d counter sets, want 8", len(m.CounterSets))
		}
		// 7 + 7 + 4 + 3 + 2 + 1 + 1 placements on each GPU.
		if len(m.Devices) != 8*25 {
			t.Errorf("%d devices, want %d", len(m.Devices), 8*25)
		}
		if sizes := sliceShape(m.Slices()); !slices.Equal(sizes, []string{"8 counter sets", "64 devices", "64 devices", "64 devices", "8 devices"}) {
			t.Errorf("slices %v", sizes)
		}
		existing := map[string]string{
			"gpu-0-mig-3g40gb-9-4":  inv.GPUs[0].MIGDevices[1].UUID,
			"gpu-0-mig-1g10gb-19-0": inv.GPUs[0].MIGDevices[0].UUID,
			"gpu-7-mig-7g80gb-0-0":  inv.GPUs[7].MIGDevices[0].UUID,
		}
		for name, uuid := range existing {
			if d, ok := m.Lookup(name); !ok || d.MIG == nil || d.MIG.UUID != uuid || d.UUID() != uuid {
				t.Errorf("%s: not the existing MIG device %s: %+v", name, uuid, d)
			}
		}
		for _, d := range m.Devices {
			if _, ok := existing[d.Name()]; !ok && d.MIG != nil {
				t.Errorf("%s: MIG device %s, but none exists there", d.Name(), d.MIG.UUID)
			}
			if d.Kind != devicemodel.KindMIG || d.Placement == nil {
				t.Fatalf("%s: kind %s, placement %v: want a MIG placement", d.Name(), d.Kind, d.Placement)
			}
			want := hardware.MIGPlacement{ParentUUID: d.GPU.UUID, ProfileID: d.Placement.Profile.ProfileID, Start: d.Placement.Start}
			if got := d.MIGPlacement(); got != want {
				t.Errorf("%s: MIGPlacement() = %v, want %v", d.Name(), got, want)
			}
		}
	})
	t.Run("gh200-dynamic-mig", func(t *testing.T) {
		inv := discoverMIG(t, parsed(gh200MIGFleet)(t), "gh200-mig-0")
		m := buildDynamic(t, inv)
		// 7 + 7 + 4 + 3 + 2 + 1 + 1 placements, as on H100.
		if sizes := sliceShape(m.Slices()); !slices.Equal(sizes, []string{"1 counter sets", "25 devices"}) {
			t.Errorf("slices %v", sizes)
		}
		if d, ok := m.Lookup("gpu-0-mig-1g12gb-me-20-6"); !ok || d.MIG == nil || d.MIG.UUID != inv.GPUs[0].MIGDevices[0].UUID {
			t.Errorf("gpu-0-mig-1g12gb-me-20-6: want the existing MIG device, got %+v", d)
		}
		for _, name := range []string{"gpu-0-mig-7g96gb-0-0", "gpu-0-mig-3g48gb-9-4", "gpu-0-mig-1g24gb-15-6"} {
			if d, ok := m.Lookup(name); !ok || d.MIG != nil {
				t.Errorf("%s: want a free placement, got %+v", name, d)
			}
		}
	})
	t.Run("mixed-dynamic-mig", func(t *testing.T) {
		inv := discoverMIG(t, parsed(mixedMIGFleet)(t), "mixed-0")
		m := buildDynamic(t, inv)
		var setNames []string
		for _, s := range m.CounterSets {
			setNames = append(setNames, s.Name)
		}
		if !slices.Equal(setNames, []string{"gpu-0-counters", "gpu-1-counters"}) {
			t.Errorf("counter sets %v, want those of the two H100s", setNames)
		}
		if sizes := sliceShape(m.Slices()); !slices.Equal(sizes, []string{"2 counter sets", "27 devices"}) {
			t.Errorf("slices %v", sizes)
		}
		full, ok := m.Lookup("gpu-1")
		if !ok || full.Kind != devicemodel.KindGPU || len(full.API.ConsumesCounters) != 1 || full.API.ConsumesCounters[0].CounterSet != "gpu-1-counters" {
			t.Errorf("gpu-1: want the full GPU consuming gpu-1-counters, got %+v", full)
		}
		l40s, ok := m.Lookup("gpu-2")
		if !ok || l40s.Kind != devicemodel.KindGPU || l40s.API.ConsumesCounters != nil || l40s.Placement != nil {
			t.Errorf("gpu-2: want the L40S as a plain full GPU, got %+v", l40s)
		}
		if d, ok := m.Lookup("gpu-0-mig-2g20gb-14-0"); !ok || d.MIG == nil || d.MIG.UUID != inv.GPUs[0].MIGDevices[0].UUID {
			t.Errorf("gpu-0-mig-2g20gb-14-0: want the existing MIG device, got %+v", d)
		}
		if _, ok := m.Lookup("gpu-0"); ok {
			t.Error("gpu-0 is in MIG mode, its full GPU must not be published")
		}
	})
}

// wholeSimProfile is the model's 7g profile, whose engines are the GPU's.
func wholeSimProfile(t testing.TB, m sim.Model) sim.MIGProfile {
	t.Helper()
	var whole sim.MIGProfile
	for _, p := range m.MIGProfiles {
		if p.Slices > whole.Slices {
			whole = p
		}
	}
	if whole.PlacementSize != m.MemorySlices {
		t.Fatalf("%s: no profile spans the GPU (%s spans %d of %d memory slices)", m.Name, whole.Name, whole.PlacementSize, m.MemorySlices)
	}
	return whole
}

// engineCounts are the counters of memory and engines, zeros left out, as
// a device consumes them.
func engineCounts(memoryMiB uint64, p sim.MIGProfile) map[string]int64 {
	c := map[string]int64{
		"memory": int64(memoryMiB << 20), "multiprocessors": int64(p.Multiprocessors), "copy-engines": int64(p.CopyEngines),
		"decoders": int64(p.Decoders), "encoders": int64(p.Encoders), "jpeg-engines": int64(p.JPEGEngines), "ofa-engines": int64(p.OFAEngines),
	}
	maps.DeleteFunc(c, func(_ string, v int64) bool { return v == 0 })
	return c
}

// TestDynamicMIGModels checks, for every simulated MIG model, the counter
// set and the devices of a GPU in MIG mode and of one not, against the
// simulator's profile table: every profile at every placement start
// exactly once, consuming its memory, engines and memory slices.
func TestDynamicMIGModels(t *testing.T) {
	for _, name := range migModels(t) {
		t.Run(name, func(t *testing.T) {
			sm := simModel(t, name)
			on, off := simGPU(t, 0, name, true), simGPU(t, 1, name, false)
			off.Minor = 3 // names follow the minor, not the index
			m := buildDynamic(t, inventoryOf(on, off))

			// Counter sets: memory, the whole-GPU profile's engines (7g,
			// 4g on A30), one per memory slice.
			whole := wholeSimProfile(t, sm)
			wantSet := engineCounts(sm.MemoryMiB, whole)
			wantSet["encoders"] = int64(whole.Encoders) // a set lists zeros too
			for i := range sm.MemorySlices {
				wantSet[fmt.Sprintf("memory-slice-%d", i)] = 1
			}
			if len(m.CounterSets) != 2 {
				t.Fatalf("%d counter sets, want 2", len(m.CounterSets))
			}
			for i, wantName := range []string{"gpu-0-counters", "gpu-3-counters"} {
				cs := m.CounterSets[i]
				if cs.Name != wantName {
					t.Errorf("counter set %d: name %s, want %s", i, cs.Name, wantName)
				}
				if got := counterValues(cs.Counters); !maps.Equal(got, wantSet) {
					t.Errorf("%s: counters\n got %v\nwant %v", cs.Name, got, wantSet)
				}
			}

			// The GPU in MIG mode: one device per profile and placement.
			type place struct {
				profile string
				start   int
			}
			want := map[place]sim.MIGProfile{}
			for _, p := range sm.MIGProfiles {
				for _, s := range p.PlacementStarts {
					want[place{p.Name, s}] = p
				}
			}
			seen := map[place]bool{}
			for _, d := range m.Devices {
				if d.GPU.UUID != on.UUID {
					continue
				}
				api := d.API
				if d.Kind != devicemodel.KindMIG || d.Placement == nil {
					t.Errorf("%s: kind %s, placement %v", api.Name, d.Kind, d.Placement)
					continue
				}
				pl := place{d.Placement.Profile.Name, d.Placement.Start}
				p, ok := want[pl]
				if !ok || seen[pl] {
					t.Errorf("%s: placement %v is not in the table or twice", api.Name, pl)
					continue
				}
				seen[pl] = true
				if wantName := devicemodel.MIGName(0, p.Name, p.ID, pl.start); api.Name != wantName {
					t.Errorf("%s: name, want %s", api.Name, wantName)
				}
				if d.MIG != nil {
					t.Errorf("%s: MIG device %s, but none exists", api.Name, d.MIG.UUID)
				}
				wantCounters := engineCounts(p.MemoryMiB, p)
				var wantCaps []resourceapi.QualifiedName
				for i := pl.start; i < pl.start+p.PlacementSize; i++ {
					wantCounters[fmt.Sprintf("memory-slice-%d", i)] = 1
					wantCaps = append(wantCaps, devicemodel.MemorySliceCapacity(i))
				}
				if len(api.ConsumesCounters) != 1 || api.ConsumesCounters[0].CounterSet != "gpu-0-counters" {
					t.Fatalf("%s: consumes %+v, want one consumption from gpu-0-counters", api.Name, api.ConsumesCounters)
				}
				if got := counterValues(api.ConsumesCounters[0].Counters); !maps.Equal(got, wantCounters) {
					t.Errorf("%s: consumes\n got %v\nwant %v", api.Name, got, wantCounters)
				}
				var gotCaps []resourceapi.QualifiedName
				for c := range api.Capacity {
					if strings.HasPrefix(string(c), "memorySlice") {
						gotCaps = append(gotCaps, c)
					}
				}
				slices.Sort(gotCaps)
				slices.Sort(wantCaps)
				if !slices.Equal(gotCaps, wantCaps) {
					t.Errorf("%s: memory slice capacities %v, want %v", api.Name, gotCaps, wantCaps)
				}
				checkQuantity(t, api, "memory", fmt.Sprintf("%dMi", p.MemoryMiB))
				checkQuantity(t, api, "multiprocessors", fmt.Sprint(p.Multiprocessors))
				for attr, want := range map[resourceapi.QualifiedName]string{"type": "mig", "profile": p.Name, "parentUUID": on.UUID} {
					if a := api.Attributes[attr]; a.StringValue == nil || *a.StringValue != want {
						t.Errorf("%s: attribute %s = %s, want %q", api.Name, attr, show(a), want)
					}
				}
				for _, attr := range []resourceapi.QualifiedName{"uuid", "index", "minor"} {
					if _, ok := api.Attributes[attr]; ok {
						t.Errorf("%s: attribute %s published for a MIG device not yet created", api.Name, attr)
					}
				}
				for _, err := range validateDevice(api) {
					t.Error(err)
				}
			}
			for pl := range want {
				if !seen[pl] {
					t.Errorf("placement %v not published", pl)
				}
			}

			// The GPU with MIG mode off: the full GPU, taking every counter.
			full, ok := m.Lookup("gpu-3")
			if !ok {
				t.Fatal("full GPU gpu-3 not published")
			}
			if full.Kind != devicemodel.KindGPU || full.Placement != nil || full.MIG != nil {
				t.Errorf("gpu-3: kind %s, placement %v, MIG %v", full.Kind, full.Placement, full.MIG)
			}
			wantAll := maps.Clone(wantSet)
			maps.DeleteFunc(wantAll, func(_ string, v int64) bool { return v == 0 })
			if c := full.API.ConsumesCounters; len(c) != 1 || c[0].CounterSet != "gpu-3-counters" || !maps.Equal(counterValues(c[0].Counters), wantAll) {
				t.Errorf("gpu-3: consumes %+v, want all of gpu-3-counters: %v", c, wantAll)
			}
			checkQuantity(t, full.API, "memory", fmt.Sprintf("%dMi", sm.MemoryMiB))
			if n := len(m.Devices); n != len(want)+1 {
				t.Errorf("%d devices, want %d placements and the full GPU", n, len(want))
			}
		})
	}
}

// TestDynamicMIGBuild covers inventories that fleets cannot express.
func TestDynamicMIGBuild(t *testing.T) {
	h100 := func(t *testing.T, migEnabled bool) hardware.GPU { return simGPU(t, 0, "H100-SXM5-80GB", migEnabled) }
	tests := []struct {
		name    string
		inv     func(*testing.T) *hardware.Inventory
		wantErr string
		names   []string // nil: do not check
		sets    []string
	}{
		{
			name: "GPU without MIG profiles is published as without the option",
			inv: func(t *testing.T) *hardware.Inventory {
				g := h100(t, true)
				g.MIGProfiles = nil
				g.MIGDevices = []hardware.MIGDevice{{UUID: "MIG-1", Profile: "7g.80gb", ProfileID: 0, PlacementSize: 8}}
				return inventoryOf(g)
			},
			names: []string{"gpu-0-mig-7g80gb-0-0"},
		},
		{
			name: "GPU without memory slices is published as without the option",
			inv: func(t *testing.T) *hardware.Inventory {
				g := h100(t, false)
				g.MIGMemorySlices = 0
				return inventoryOf(g)
			},
			names: []string{"gpu-0"},
		},
		{
			name:  "not MIG-capable",
			inv:   func(t *testing.T) *hardware.Inventory { return inventoryOf(simGPU(t, 0, "L40S", false)) },
			names: []string{"gpu-0"},
		},
		{
			name:  "no GPUs",
			inv:   func(t *testing.T) *hardware.Inventory { return inventoryOf() },
			names: []string{},
		},
		{
			name: "placement beyond the memory slices",
			inv: func(t *testing.T) *hardware.Inventory {
				g := h100(t, true)
				g.MIGProfiles[0].PlacementStarts = append(g.MIGProfiles[0].PlacementStarts, 8)
				return inventoryOf(g)
			},
			wantErr: "profile 1g.10gb: placement 8..8 is not within the 8 memory slices",
		},
		{
			name: "placement size zero",
			inv: func(t *testing.T) *hardware.Inventory {
				g := h100(t, true)
				g.MIGProfiles[3].PlacementSize = 0
				return inventoryOf(g)
			},
			wantErr: "profile 2g.20gb: placement size 0",
		},
		{
			name: "no profile spans the GPU",
			inv: func(t *testing.T) *hardware.Inventory {
				g := h100(t, true)
				g.MIGProfiles = g.MIGProfiles[:6]
				return inventoryOf(g)
			},
			wantErr: "no MIG profile spans all 8 memory slices",
		},
		{
			name: "too many memory slices for one counter set",
			inv: func(t *testing.T) *hardware.Inventory {
				g := h100(t, true)
				g.MIGMemorySlices = 26
				g.MIGProfiles[6].PlacementSize = 26
				return inventoryOf(g)
			},
			wantErr: "26 memory slices need 33 counters",
		},
		{
			name: "existing MIG device at no placement",
			inv: func(t *testing.T) *hardware.Inventory {
				g := h100(t, true)
				g.MIGDevices = []hardware.MIGDevice{{UUID: "MIG-odd", Profile: "3g.40gb", ProfileID: 9, PlacementStart: 2, PlacementSize: 4}}
				return inventoryOf(g)
			},
			wantErr: "MIG device MIG-odd (3g.40gb, profile ID 9 at 2) is at no placement",
		},
		{
			name: "two GPUs with one minor",
			inv: func(t *testing.T) *hardware.Inventory {
				a, b := h100(t, false), h100(t, false)
				b.Index, b.UUID = 1, "GPU-other"
				return inventoryOf(a, b)
			},
			wantErr: `counter set name "gpu-0-counters" is not unique`,
		},
		{
			name: "existing MIG devices are found by profile ID and start",
			inv: func(t *testing.T) *hardware.Inventory {
				g := h100(t, true)
				g.MIGDevices = []hardware.MIGDevice{
					{UUID: "MIG-a", Profile: "1g.20gb", ProfileID: 15, PlacementStart: 6, PlacementSize: 2},
					{UUID: "MIG-b", Profile: "4g.40gb", ProfileID: 5, PlacementStart: 0, PlacementSize: 4},
				}
				return inventoryOf(g)
			},
			sets: []string{"gpu-0-counters"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv := tt.inv(t)
			m, err := devicemodel.Build(inv, devicemodel.WithDynamicMIG())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Build error = %v, want one containing %q", err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), "GPU ") {
					t.Errorf("error %q does not name the GPU", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			names := []string{}
			for _, d := range m.Devices {
				names = append(names, d.Name())
			}
			if tt.names != nil && !slices.Equal(names, tt.names) {
				t.Errorf("devices %q, want %q", names, tt.names)
			}
			sets := []string{}
			for _, s := range m.CounterSets {
				sets = append(sets, s.Name)
			}
			if tt.sets == nil {
				tt.sets = []string{}
			}
			if !slices.Equal(sets, tt.sets) {
				t.Errorf("counter sets %q, want %q", sets, tt.sets)
			}
			for _, err := range validatePool(m.Slices()) {
				t.Error(err)
			}
			for _, g := range inv.GPUs {
				for _, mig := range g.MIGDevices {
					d, ok := m.Lookup(devicemodel.MIGName(g.Minor, mig.Profile, mig.ProfileID, mig.PlacementStart))
					if !ok || d.MIG == nil || d.MIG.UUID != mig.UUID {
						t.Errorf("existing MIG device %s not published as itself: %+v", mig.UUID, d)
					}
				}
			}
		})
	}
}

// TestStaticBuildIgnoresMIGProfiles: without the option, discovery's
// profiles change nothing, so the golden files of static MIG hold.
func TestStaticBuildIgnoresMIGProfiles(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.golden, func(t *testing.T) {
			inv := discoverMIG(t, tc.fleet(t), tc.node)
			withProfiles := build(t, inv)
			for i := range inv.GPUs {
				inv.GPUs[i].MIGProfiles, inv.GPUs[i].MIGMemorySlices = nil, 0
			}
			plain := build(t, inv)
			if len(withProfiles.CounterSets) != 0 {
				t.Errorf("counter sets without dynamic MIG: %v", withProfiles.CounterSets)
			}
			a, _ := yaml.Marshal(plain.APIDevices())
			b, _ := yaml.Marshal(withProfiles.APIDevices())
			if !bytes.Equal(a, b) {
				t.Errorf("MIG profiles changed the static devices:\n%s", lineDiff(string(a), string(b)))
			}
		})
	}
}
