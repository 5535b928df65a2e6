package devicemodel_test

import (
	"bytes"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// The *Sharing flag value is a pflag.Value.
var _ pflag.Value = (*devicemodel.Sharing)(nil)

// sharingModes are one setting of every mode that shares.
var sharingModes = []devicemodel.Sharing{
	{Mode: devicemodel.SharingMemoryCompute},
	{Mode: devicemodel.SharingShares, Shares: 4},
	{Mode: devicemodel.SharingShares, Shares: 1},
	{Mode: devicemodel.SharingUnlimited},
}

func TestParseSharing(t *testing.T) {
	valid := []struct {
		in   string
		want devicemodel.Sharing
	}{
		{"none", devicemodel.Sharing{Mode: devicemodel.SharingNone}},
		{"memory-compute", devicemodel.Sharing{Mode: devicemodel.SharingMemoryCompute}},
		{"shares=4", devicemodel.Sharing{Mode: devicemodel.SharingShares, Shares: 4}},
		{"shares=1", devicemodel.Sharing{Mode: devicemodel.SharingShares, Shares: 1}},
		{"shares=100", devicemodel.Sharing{Mode: devicemodel.SharingShares, Shares: 100}},
		{"unlimited", devicemodel.Sharing{Mode: devicemodel.SharingUnlimited}},
	}
	for _, tt := range valid {
		t.Run(tt.in, func(t *testing.T) {
			got, err := devicemodel.ParseSharing(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("= %+v, want %+v", got, tt.want)
			}
			if got.String() != tt.in {
				t.Errorf("String() = %q, want %q", got.String(), tt.in)
			}
			if got.Enabled() != (tt.in != "none") {
				t.Errorf("Enabled() = %v", got.Enabled())
			}
		})
	}
	allowed := "none, memory-compute, shares=<N> (N from 1 to 100) or unlimited"
	invalid := []struct{ in, want string }{
		{"", `sharing "": must be ` + allowed},
		{"memory", `sharing "memory": must be ` + allowed},
		{"disabled", `sharing "disabled": must be ` + allowed},
		{"4", `sharing "4": must be ` + allowed},
		{"Shares=4", `sharing "Shares=4": must be ` + allowed},
		{"shares", `sharing "shares": must be ` + allowed},
		{"shares=", `the number of shares "" is not a whole number`},
		{"shares=four", `the number of shares "four" is not a whole number`},
		{"shares=+4", `the number of shares "+4" is not a whole number`},
		{"shares=04", `the number of shares "04" is not a whole number`},
		{"shares=0", "sharing shares=0: the number of shares must be from 1 to 100"},
		{"shares=101", "sharing shares=101: the number of shares must be from 1 to 100"},
		{"shares=-1", "sharing shares=-1: the number of shares must be from 1 to 100"},
	}
	for _, tt := range invalid {
		t.Run("invalid "+tt.in, func(t *testing.T) {
			_, err := devicemodel.ParseSharing(tt.in)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestSharingFlag(t *testing.T) {
	var s devicemodel.Sharing
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	fs.SetOutput(&bytes.Buffer{})
	fs.Var(&s, "sharing", "how full GPUs are shared")
	if got := fs.Lookup("sharing").DefValue; got != "none" {
		t.Errorf("default shows as %q, want none", got)
	}
	if err := fs.Parse([]string{"--sharing=shares=8"}); err != nil {
		t.Fatal(err)
	}
	if s != (devicemodel.Sharing{Mode: devicemodel.SharingShares, Shares: 8}) {
		t.Errorf("parsed %+v", s)
	}
	err := fs.Parse([]string{"--sharing=mps"})
	if err == nil || !strings.Contains(err.Error(), "memory-compute") {
		t.Errorf("bad value: error %v, want one naming the allowed values", err)
	}
}

// TestSharingValidate covers settings made in code, which Build refuses.
func TestSharingValidate(t *testing.T) {
	tests := []struct {
		s    devicemodel.Sharing
		want string
	}{
		{devicemodel.Sharing{Mode: "mps"}, `sharing mode "mps": must be none, memory-compute`},
		{devicemodel.Sharing{Mode: devicemodel.SharingShares}, "shares=0: the number of shares must be from 1 to 100"},
		{devicemodel.Sharing{Mode: devicemodel.SharingUnlimited, Shares: 2}, "sharing unlimited: shares 2: only shares=<N> takes a number of shares"},
		{devicemodel.Sharing{Shares: 2}, "sharing none: shares 2"},
	}
	for _, tt := range tests {
		t.Run(string(tt.s.Mode), func(t *testing.T) {
			_, err := devicemodel.Build(inventoryOf(simGPU(t, 0, "L40S", false)), devicemodel.WithSharing(tt.s))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Build: error %v, want one containing %q", err, tt.want)
			}
		})
	}
	if err := (devicemodel.Sharing{}).Validate(); err != nil {
		t.Errorf("zero Sharing: %v", err)
	}
}

// Options for the sharing rule, by name.
var (
	switchAll = devicemodel.WithMIGModeSwitching(func(hardware.GPU) bool { return true })
	vfioFor   = func(mode devicemodel.VFIOMode) devicemodel.Option { return devicemodel.WithVFIO(mode, anyVFIO) }
	anyVFIO   = func(g hardware.GPU) (devicemodel.VFIOInfo, bool) {
		return devicemodel.VFIOInfo{VendorID: "0x10de", DeviceID: "0x2330", IOMMUGroup: 20 + g.Index}, true
	}
)

// TestSharingRule pins which devices are shared for each state of a GPU,
// and that a shared device with counters takes all of them, so that a
// share excludes MIG and VFIO devices of its GPU.
func TestSharingRule(t *testing.T) {
	tests := []struct {
		name       string
		gpu        func(*testing.T) hardware.GPU
		opts       []devicemodel.Option
		shared     []string
		notShared  []string // the other devices, MIG devices left out
		withCounts bool     // the shared GPU consumes a counter set
	}{
		{"no MIG", func(t *testing.T) hardware.GPU { return simGPU(t, 0, "L40S", false) },
			nil, []string{"gpu-0"}, nil, false},
		{"MIG off, static", func(t *testing.T) hardware.GPU { return simGPU(t, 0, "H100-SXM5-80GB", false) },
			nil, []string{"gpu-0"}, nil, false},
		{"MIG on, static", func(t *testing.T) hardware.GPU {
			g := simGPU(t, 0, "H100-SXM5-80GB", true)
			g.MIGDevices = []hardware.MIGDevice{{UUID: "MIG-a", Profile: "7g.80gb", ProfileID: 0, PlacementSize: 8}}
			return g
		}, nil, nil, nil, false},
		{"MIG off, dynamic", func(t *testing.T) hardware.GPU { return simGPU(t, 0, "H100-SXM5-80GB", false) },
			[]devicemodel.Option{devicemodel.WithDynamicMIG()}, []string{"gpu-0"}, nil, true},
		{"MIG on, dynamic", func(t *testing.T) hardware.GPU { return simGPU(t, 0, "H100-SXM5-80GB", true) },
			[]devicemodel.Option{devicemodel.WithDynamicMIG()}, nil, nil, false},
		{"MIG on, dynamic, mode switching", func(t *testing.T) hardware.GPU { return simGPU(t, 0, "H100-SXM5-80GB", true) },
			[]devicemodel.Option{devicemodel.WithDynamicMIG(), switchAll}, []string{"gpu-0"}, nil, true},
		{"MIG off, dynamic, mode switching, VFIO beside", func(t *testing.T) hardware.GPU { return simGPU(t, 0, "H100-SXM5-80GB", false) },
			[]devicemodel.Option{devicemodel.WithDynamicMIG(), switchAll, vfioFor(devicemodel.VFIOBeside)}, []string{"gpu-0"}, []string{"gpu-vfio-0"}, true},
		{"no MIG, VFIO beside", func(t *testing.T) hardware.GPU { return simGPU(t, 0, "L40S", false) },
			[]devicemodel.Option{vfioFor(devicemodel.VFIOBeside)}, []string{"gpu-0"}, []string{"gpu-vfio-0"}, true},
		{"MIG on, dynamic, VFIO beside", func(t *testing.T) hardware.GPU { return simGPU(t, 0, "H100-SXM5-80GB", true) },
			[]devicemodel.Option{devicemodel.WithDynamicMIG(), vfioFor(devicemodel.VFIOBeside)}, nil, nil, false},
		{"VFIO only", func(t *testing.T) hardware.GPU { return simGPU(t, 0, "H100-SXM5-80GB", false) },
			[]devicemodel.Option{vfioFor(devicemodel.VFIOOnly)}, nil, []string{"gpu-vfio-0"}, false},
	}
	for _, tt := range tests {
		for _, mode := range sharingModes {
			t.Run(tt.name+"/"+mode.String(), func(t *testing.T) {
				m, err := devicemodel.Build(inventoryOf(tt.gpu(t)), append(slices.Clone(tt.opts), devicemodel.WithSharing(mode))...)
				if err != nil {
					t.Fatalf("Build: %v", err)
				}
				var shared, notShared []string
				for i := range m.Devices {
					d := &m.Devices[i]
					isShared := ptr.Deref(d.API.AllowMultipleAllocations, false)
					if isShared != d.Sharing.Enabled() || (isShared && d.Sharing != mode) {
						t.Errorf("%s: allowMultipleAllocations %v, Sharing %v", d.Name(), isShared, d.Sharing)
					}
					switch {
					case isShared:
						shared = append(shared, d.Name())
					case d.Kind != devicemodel.KindMIG:
						notShared = append(notShared, d.Name())
					}
					for name, c := range d.API.Capacity {
						if c.RequestPolicy != nil && !isShared {
							t.Errorf("%s: capacity %s has a request policy but the device is not shared", d.Name(), name)
						}
					}
				}
				if !slices.Equal(shared, tt.shared) || !slices.Equal(notShared, tt.notShared) {
					t.Errorf("shared %v and not %v, want %v and %v", shared, notShared, tt.shared, tt.notShared)
				}
				for _, name := range shared {
					d, _ := m.Lookup(name)
					if got := len(d.API.ConsumesCounters) > 0; got != tt.withCounts {
						t.Errorf("%s consumes counters: %v, want %v", name, got, tt.withCounts)
					}
				}
				checkSharesTakeWholeCounterSets(t, m)
			})
		}
	}
}

// checkSharesTakeWholeCounterSets fails unless every shared device that
// consumes counters consumes every counter of its set in full: the
// scheduler charges them once while any share is allocated, which then
// leaves nothing for another device of the set.
func checkSharesTakeWholeCounterSets(t *testing.T, m *devicemodel.Model) {
	t.Helper()
	sets := map[string]map[string]int64{}
	for _, cs := range m.CounterSets {
		sets[cs.Name] = counterValues(cs.Counters)
	}
	for i := range m.Devices {
		d := &m.Devices[i]
		if !d.Sharing.Enabled() {
			continue
		}
		for _, c := range d.API.ConsumesCounters {
			want := maps.Clone(sets[c.CounterSet])
			maps.DeleteFunc(want, func(_ string, v int64) bool { return v == 0 })
			if got := counterValues(c.Counters); !maps.Equal(got, want) {
				t.Errorf("shared %s consumes %v of %s, want all of it: %v", d.Name(), got, c.CounterSet, want)
			}
		}
	}
}

// TestSharedGPUCapacities pins the published capacities and request
// policies of a shared H100 in each mode.
func TestSharedGPUCapacities(t *testing.T) {
	mem := resource.MustParse("81559Mi")
	q := resource.MustParse
	rng := func(def, lo, hi string, step *string) *resourceapi.CapacityRequestPolicy {
		p := &resourceapi.CapacityRequestPolicy{Default: ptr.To(q(def)), ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(q(lo)), Max: ptr.To(q(hi))}}
		if step != nil {
			p.ValidRange.Step = ptr.To(q(*step))
		}
		return p
	}
	one := ptr.To("1")
	tests := []struct {
		sharing devicemodel.Sharing
		want    map[resourceapi.QualifiedName]resourceapi.DeviceCapacity
	}{
		{devicemodel.Sharing{Mode: devicemodel.SharingMemoryCompute}, map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory":  {Value: mem, RequestPolicy: rng("81559Mi", "1Mi", "81559Mi", one)},
			"compute": {Value: q("100"), RequestPolicy: rng("0", "0", "100", one)},
		}},
		{devicemodel.Sharing{Mode: devicemodel.SharingShares, Shares: 4}, map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory": {Value: mem, RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: ptr.To(q("0")), ValidValues: []resource.Quantity{q("0")}}},
			"shares": {Value: q("4"), RequestPolicy: rng("4", "1", "4", one)},
		}},
		{devicemodel.Sharing{Mode: devicemodel.SharingShares, Shares: 4, ShareByDefault: true}, map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory": {Value: mem, RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: ptr.To(q("0")), ValidValues: []resource.Quantity{q("0")}}},
			"shares": {Value: q("4"), RequestPolicy: rng("1", "1", "4", one)},
		}},
		{devicemodel.Sharing{Mode: devicemodel.SharingShares, Shares: 1}, map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory": {Value: mem, RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: ptr.To(q("0")), ValidValues: []resource.Quantity{q("0")}}},
			"shares": {Value: q("1"), RequestPolicy: rng("1", "1", "1", nil)},
		}},
		{devicemodel.Sharing{Mode: devicemodel.SharingUnlimited}, map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory": {Value: mem, RequestPolicy: rng("81559Mi", "0", "81559Mi", one)},
		}},
		{devicemodel.Sharing{Mode: devicemodel.SharingUnlimited, ShareByDefault: true}, map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"memory": {Value: mem, RequestPolicy: rng("0", "0", "81559Mi", one)},
		}},
		{devicemodel.Sharing{}, map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: mem}}},
	}
	for _, tt := range tests {
		t.Run(tt.sharing.String(), func(t *testing.T) {
			m, err := devicemodel.Build(inventoryOf(simGPU(t, 0, "H100-SXM5-80GB", false)), devicemodel.WithSharing(tt.sharing))
			if err != nil {
				t.Fatal(err)
			}
			got := m.Devices[0].API
			if !equalYAML(t, got.Capacity, tt.want) {
				y, _ := yaml.Marshal(got.Capacity)
				t.Errorf("capacity:\n%s", y)
			}
			if want := tt.sharing.Enabled(); ptr.Deref(got.AllowMultipleAllocations, false) != want || (got.AllowMultipleAllocations != nil) != want {
				t.Errorf("allowMultipleAllocations %v, want %v", got.AllowMultipleAllocations, want)
			}
		})
	}
}

// TestSharingKeepsNamesAndAttributes: sharing adds capacities and
// allowMultipleAllocations, nothing else, on every built-in fleet.
func TestSharingKeepsNamesAndAttributes(t *testing.T) {
	for _, name := range simfleet.BuiltinNames() {
		f := builtin(name)(t)
		for _, node := range f.NodeNames() {
			inv := discoverMIG(t, f, node)
			plain := buildDynamic(t, inv)
			for _, mode := range sharingModes {
				m, err := devicemodel.Build(inv, devicemodel.WithDynamicMIG(), devicemodel.WithSharing(mode))
				if err != nil {
					t.Fatalf("%s %s: %v", node, mode, err)
				}
				if len(m.Devices) != len(plain.Devices) {
					t.Fatalf("%s %s: %d devices, %d without sharing", node, mode, len(m.Devices), len(plain.Devices))
				}
				for i := range m.Devices {
					got, want := m.Devices[i].API, plain.Devices[i].API
					if attr := got.Attributes[devicemodel.AttrSharingMode]; got.AllowMultipleAllocations != nil && ptr.Deref(attr.StringValue, "") != string(m.Devices[i].Sharing.Mode) {
						t.Errorf("%s %s: shared device %s has sharingMode %v", node, mode, got.Name, ptr.Deref(attr.StringValue, "<none>"))
					}
					if want.Attributes[devicemodel.AttrSharingMode].StringValue != nil {
						// Every other attribute stays.
						got.Attributes = maps.Clone(got.Attributes)
						got.Attributes[devicemodel.AttrSharingMode] = want.Attributes[devicemodel.AttrSharingMode]
					}
					if got.Name != want.Name || !reflect.DeepEqual(got.Attributes, want.Attributes) || !reflect.DeepEqual(got.ConsumesCounters, want.ConsumesCounters) ||
						!got.Capacity[devicemodel.CapMemory].Value.Equal(want.Capacity[devicemodel.CapMemory].Value) {
						t.Errorf("%s %s: device %d is %s, without sharing %s, or differs in attributes, counters or memory", node, mode, i, got.Name, want.Name)
					}
				}
				if !reflect.DeepEqual(m.CounterSets, plain.CounterSets) {
					t.Errorf("%s %s: counter sets differ from those without sharing", node, mode)
				}
			}
		}
	}
}

// TestSharingPassesAPIValidation checks the slices of every built-in fleet
// and the test fleets, in every sharing mode, with static MIG, dynamic MIG
// and dynamic MIG with mode switching and VFIO, against the API's rules.
func TestSharingPassesAPIValidation(t *testing.T) {
	fleets := map[string]func(*testing.T) *simfleet.Fleet{
		"h100-mig": parsed(h100MIGFleet), "dgx-h100-mig": parsed(dgxH100MIGFleet), "mixed": parsed(mixedMIGFleet),
	}
	for _, name := range simfleet.BuiltinNames() {
		fleets[name] = builtin(name)
	}
	variants := []struct {
		name      string
		opts      []devicemodel.Option
		switching bool
	}{
		{"static", nil, false},
		{"static, VFIO beside", []devicemodel.Option{vfioFor(devicemodel.VFIOBeside)}, false},
		{"dynamic", []devicemodel.Option{devicemodel.WithDynamicMIG()}, false},
		{"dynamic, switching, VFIO beside", []devicemodel.Option{devicemodel.WithDynamicMIG(), switchAll, vfioFor(devicemodel.VFIOBeside)}, true},
	}
	for _, fleetName := range slices.Sorted(maps.Keys(fleets)) {
		f := fleets[fleetName](t)
		for _, v := range variants {
			for _, mode := range sharingModes {
				t.Run(fleetName+"/"+v.name+"/"+mode.String(), func(t *testing.T) {
					for _, node := range f.NodeNames() {
						inv := discoverMIG(t, f, node)
						m, err := devicemodel.Build(inv, append(slices.Clone(v.opts), devicemodel.WithSharing(mode))...)
						if err != nil {
							t.Fatalf("%s: %v", node, err)
						}
						for _, err := range validatePool(m.Slices()) {
							t.Errorf("%s: %v", node, err)
						}
						// Every GPU offered whole is shared, and nothing else;
						// a GPU whose memory is unknown (GB10) is not shared.
						want, got := 0, 0
						for _, g := range inv.GPUs {
							if g.IsUnread(hardware.PropertyMemory) {
								continue
							}
							if !g.MIGEnabled || (v.switching && len(g.MIGProfiles) > 0) {
								want++
							}
						}
						for i := range m.Devices {
							if m.Devices[i].Sharing.Enabled() {
								got++
							}
						}
						if got != want {
							t.Errorf("%s: %d devices shared, want %d (the GPUs offered whole)", node, got, want)
						}
					}
				})
			}
		}
	}
}

// sharingGoldenCases are nodes whose slices are pinned in testdata, one
// per sharing mode: a GPU in MIG mode (not shared), one not (shared), and
// an L40S (shared).
var sharingGoldenCases = []struct {
	golden  string
	sharing devicemodel.Sharing
}{
	{"mixed-memory-compute", devicemodel.Sharing{Mode: devicemodel.SharingMemoryCompute}},
	{"mixed-shares-4", devicemodel.Sharing{Mode: devicemodel.SharingShares, Shares: 4}},
	{"mixed-unlimited", devicemodel.Sharing{Mode: devicemodel.SharingUnlimited}},
}

// TestGoldenSharing pins the slices of a node in each sharing mode, byte
// for byte. Run with -update to rewrite the files, then read the diff;
// TestSharedGPUCapacities checks the figures independently.
func TestGoldenSharing(t *testing.T) {
	for _, tc := range sharingGoldenCases {
		t.Run(tc.golden, func(t *testing.T) {
			m, err := devicemodel.Build(discover(t, parsed(mixedMIGFleet)(t), "mixed-0"), devicemodel.WithSharing(tc.sharing))
			if err != nil {
				t.Fatal(err)
			}
			var out []goldenSlice
			for _, s := range m.Slices() {
				out = append(out, goldenSlice{SharedCounters: s.SharedCounters, Devices: s.Devices})
			}
			checkGolden(t, tc.golden, "slices", out)
		})
	}
}
