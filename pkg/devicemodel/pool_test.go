package devicemodel_test

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// TestDynamicMIGSlicesPassAPIValidation checks the slices of every
// built-in fleet, the test fleets and a node with more GPUs than one slice
// takes counter sets against the API's rules, in dynamic MIG mode.
func TestDynamicMIGSlicesPassAPIValidation(t *testing.T) {
	big := "nodes:\n- name: big-0\n  gpus:\n"
	for i := range 19 {
		big += fmt.Sprintf("  - {model: H100-SXM5-80GB, migEnabled: %v}\n", i%3 != 0)
	}
	type ref struct {
		label string
		fleet func(*testing.T) *simfleet.Fleet
	}
	var refs []ref
	for _, name := range simfleet.BuiltinNames() {
		refs = append(refs, ref{name, builtin(name)})
	}
	refs = append(refs, ref{"h100-mig", parsed(h100MIGFleet)}, ref{"dgx-h100-mig", parsed(dgxH100MIGFleet)},
		ref{"mixed", parsed(mixedMIGFleet)}, ref{"big", parsed(big)})
	for _, r := range refs {
		t.Run(r.label, func(t *testing.T) {
			f := r.fleet(t)
			for _, node := range f.NodeNames() {
				m := buildDynamic(t, discoverMIG(t, f, node))
				got := m.Slices()
				for _, err := range validatePool(got) {
					t.Errorf("%s: %v", node, err)
				}
				// Nothing lost: all counter sets, then all devices, in order.
				var sets []resourceapi.CounterSet
				var devices []resourceapi.Device
				for _, s := range got {
					if s.SharedCounters != nil && len(devices) > 0 {
						t.Errorf("%s: counter sets after devices", node)
					}
					sets = append(sets, s.SharedCounters...)
					devices = append(devices, s.Devices...)
				}
				if !reflect.DeepEqual(sets, m.CounterSets) || !reflect.DeepEqual(devices, m.APIDevices()) {
					t.Errorf("%s: slices do not hold the model's counter sets and devices in order", node)
				}
			}
		})
	}
	if sizes := sliceShape(buildDynamic(t, discoverMIG(t, parsed(big)(t), "big-0")).Slices()); !slices.Equal(sizes[:3], []string{"8 counter sets", "8 counter sets", "3 counter sets"}) {
		t.Errorf("19 counter sets in slices %v, want 8, 8, 3", sizes)
	}
}

// TestValidatePoolRejects makes sure the pool validator can fail.
func TestValidatePoolRejects(t *testing.T) {
	one := resource.MustParse("1")
	set := func(name string, counters ...string) resourceapi.CounterSet {
		cs := resourceapi.CounterSet{Name: name, Counters: map[string]resourceapi.Counter{}}
		for _, c := range counters {
			cs.Counters[c] = resourceapi.Counter{Value: one}
		}
		return cs
	}
	consuming := func(name, setName string, counters ...string) resourceapi.Device {
		d := resourceapi.Device{Name: name, ConsumesCounters: []resourceapi.DeviceCounterConsumption{{CounterSet: setName, Counters: map[string]resourceapi.Counter{}}}}
		for _, c := range counters {
			d.ConsumesCounters[0].Counters[c] = resourceapi.Counter{Value: one}
		}
		return d
	}
	many := func(n int) []resourceapi.CounterSet {
		var out []resourceapi.CounterSet
		for i := range n {
			out = append(out, set(fmt.Sprintf("s-%d", i), "c"))
		}
		return out
	}
	manyDevices := func(n int) []resourceapi.Device {
		var out []resourceapi.Device
		for i := range n {
			out = append(out, consuming(fmt.Sprintf("d-%d", i), "s-0", "c"))
		}
		return out
	}
	manyCounters := set("s-0")
	for i := range 33 {
		manyCounters.Counters[fmt.Sprintf("c-%d", i)] = resourceapi.Counter{Value: one}
	}
	tests := []struct {
		name   string
		slices []resourceslice.Slice
		want   string
	}{
		{"no slices", nil, "no slices"},
		{"devices and counters in one slice", []resourceslice.Slice{{SharedCounters: many(1), Devices: []resourceapi.Device{}}}, "only one of"},
		{"nine counter sets", []resourceslice.Slice{{SharedCounters: many(9)}}, "9 counter sets"},
		{"65 consuming devices", []resourceslice.Slice{{SharedCounters: many(1)}, {Devices: manyDevices(65)}}, "65 devices, more than 64"},
		{"upper-case counter", []resourceslice.Slice{{SharedCounters: []resourceapi.CounterSet{set("s-0", "copyEngines")}}}, `counter "copyEngines"`},
		{"upper-case counter set", []resourceslice.Slice{{SharedCounters: []resourceapi.CounterSet{set("GPU-0", "c")}}}, `counter set "GPU-0": name`},
		{"33 counters", []resourceslice.Slice{{SharedCounters: []resourceapi.CounterSet{manyCounters}}}, "33 counters"},
		{"counter set twice", []resourceslice.Slice{{SharedCounters: many(1)}, {SharedCounters: many(1)}}, "twice in the pool"},
		{"unknown counter set", []resourceslice.Slice{{SharedCounters: many(1)}, {Devices: []resourceapi.Device{consuming("d", "s-1", "c")}}}, "not in the pool"},
		{"unknown counter", []resourceslice.Slice{{SharedCounters: many(1)}, {Devices: []resourceapi.Device{consuming("d", "s-0", "x")}}}, `counter "x" is not in counter set`},
		{"three consumptions", []resourceslice.Slice{{SharedCounters: many(3)}, {Devices: []resourceapi.Device{{Name: "d", ConsumesCounters: []resourceapi.DeviceCounterConsumption{
			consuming("", "s-0", "c").ConsumesCounters[0], consuming("", "s-1", "c").ConsumesCounters[0], consuming("", "s-2", "c").ConsumesCounters[0]}}}}}, "3 counter consumptions"},
		{"device twice", []resourceslice.Slice{{Devices: []resourceapi.Device{{Name: "d"}}}, {Devices: []resourceapi.Device{{Name: "d"}}}}, `device "d" twice`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := validatePool(tt.slices)
			for _, err := range errs {
				if strings.Contains(err.Error(), tt.want) {
					return
				}
			}
			t.Errorf("errors %v do not mention %q", errs, tt.want)
		})
	}
}

func TestPoolSlices(t *testing.T) {
	sets := func(n int) []resourceapi.CounterSet {
		out := make([]resourceapi.CounterSet, n)
		for i := range out {
			out[i] = resourceapi.CounterSet{Name: fmt.Sprintf("gpu-%d-counters", i), Counters: map[string]resourceapi.Counter{"memory-slice-0": {Value: resource.MustParse("1")}}}
		}
		return out
	}
	consuming := func(n int) []resourceapi.Device {
		out := plainDevices(n)
		for i := range out {
			out[i].ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: "gpu-0-counters", Counters: map[string]resourceapi.Counter{"memory-slice-0": {Value: resource.MustParse("1")}}}}
		}
		return out
	}
	tests := []struct {
		name    string
		sets    []resourceapi.CounterSet
		devices []resourceapi.Device
		want    []string
	}{
		{"nothing", nil, nil, []string{"0 devices"}},
		{"devices only", nil, plainDevices(130), []string{"128 devices", "2 devices"}},
		{"counter sets only", sets(3), nil, []string{"3 counter sets"}},
		{"eight counter sets", sets(8), consuming(1), []string{"8 counter sets", "1 devices"}},
		{"nine counter sets", sets(9), consuming(64), []string{"8 counter sets", "1 counter sets", "64 devices"}},
		{"seventeen counter sets", sets(17), consuming(65), []string{"8 counter sets", "8 counter sets", "1 counter sets", "64 devices", "1 devices"}},
		{"consuming and plain devices", sets(1), append(plainDevices(100), consuming(1)...), []string{"1 counter sets", "64 devices", "37 devices"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := devicemodel.PoolSlices(tt.sets, tt.devices)
			if shape := sliceShape(got); !slices.Equal(shape, tt.want) {
				t.Errorf("slices %v, want %v", shape, tt.want)
			}
			for i, s := range got {
				if s.Devices != nil && s.SharedCounters != nil {
					t.Errorf("slice %d has devices and counter sets", i)
				}
			}
			if again := devicemodel.PoolSlices(tt.sets, tt.devices); !equalYAML(t, again, got) {
				t.Error("two calls differ")
			}
		})
	}
	// The model's pool is the same, under the node's name.
	m := buildDynamic(t, discoverMIG(t, parsed(mixedMIGFleet)(t), "mixed-0"))
	res := m.DriverResources("mixed-0")
	if len(res.Pools) != 1 || !equalYAML(t, res.Pools["mixed-0"].Slices, devicemodel.PoolSlices(m.CounterSets, m.APIDevices())) {
		t.Errorf("Model.DriverResources = %+v, want one pool named mixed-0 with PoolSlices", res)
	}
	// The package-level DriverResources publishes no counter sets.
	if s := devicemodel.DriverResources("n", plainDevices(1)).Pools["n"].Slices; len(s) != 1 || s[0].SharedCounters != nil {
		t.Errorf("DriverResources(devices) = %+v", s)
	}
}
