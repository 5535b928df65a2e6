package slicevalidation_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/kubernetes/pkg/api/legacyscheme"
	"k8s.io/kubernetes/pkg/apis/resource"
	_ "k8s.io/kubernetes/pkg/apis/resource/install" // resource.k8s.io in legacyscheme, with its declarative validation
	sliceregistry "k8s.io/kubernetes/pkg/registry/resource/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

const driverName = "gpu.nvidia.com"

// inventory is one node to publish.
type inventory struct {
	label string
	inv   *hardware.Inventory
}

// TestResourceSlicesValidate publishes, with static and with dynamic MIG,
// every node of every built-in fleet and a set of hand-built MIG nodes,
// and runs each ResourceSlice through what the API server does on create:
// defaulting, conversion to the internal API, the strategy's preparation
// (which drops fields of disabled features: nothing may be dropped under
// the default gates), the handwritten validation and the declarative
// rules. No errors are expected.
func TestResourceSlicesValidate(t *testing.T) {
	nodes := append(builtinNodes(t), handBuiltNodes(t)...)
	modes := []struct {
		name string
		opts []devicemodel.Option
	}{
		{"static", nil},
		{"dynamic", []devicemodel.Option{devicemodel.WithDynamicMIG()}},
		{"static+vfio", []devicemodel.Option{vfioEverywhere(devicemodel.VFIOBeside)}},
		{"dynamic+vfio", []devicemodel.Option{devicemodel.WithDynamicMIG(), vfioEverywhere(devicemodel.VFIOBeside)}},
		{"vfio-only", []devicemodel.Option{vfioEverywhere(devicemodel.VFIOOnly)}},
		{"memory-compute", []devicemodel.Option{sharing(t, "memory-compute")}},
		{"shares=4+dynamic+vfio", []devicemodel.Option{sharing(t, "shares=4"), devicemodel.WithDynamicMIG(), vfioEverywhere(devicemodel.VFIOBeside)}},
		{"shares=1", []devicemodel.Option{sharing(t, "shares=1")}},
		{"unlimited", []devicemodel.Option{sharing(t, "unlimited")}},
	}
	for _, n := range nodes {
		for _, mode := range modes {
			t.Run(n.label+"/"+mode.name, func(t *testing.T) {
				m, err := devicemodel.Build(n.inv, mode.opts...)
				if err != nil {
					t.Fatalf("Build: %v", err)
				}
				objs := sliceObjects("node-0", driverName, m.DriverResources("node-0"))
				var sets, devices int
				for _, obj := range objs {
					sets += len(obj.Spec.SharedCounters)
					devices += len(obj.Spec.Devices)
					for _, err := range validateCreate(t, obj) {
						t.Errorf("%s: %v", obj.Name, err)
					}
				}
				if sets != len(m.CounterSets) || devices != len(m.Devices) {
					t.Errorf("%d counter sets and %d devices published, the model has %d and %d", sets, devices, len(m.CounterSets), len(m.Devices))
				}
				if strings.HasPrefix(mode.name, "dynamic") && hasMIGCapable(n.inv) && sets == 0 {
					t.Error("dynamic MIG published no counter sets for a node with MIG-capable GPUs")
				}
			})
		}
	}
}

// sharing shares full GPUs as v says.
func sharing(t *testing.T, v string) devicemodel.Option {
	t.Helper()
	s, err := devicemodel.ParseSharing(v)
	if err != nil {
		t.Fatal(err)
	}
	return devicemodel.WithSharing(s)
}

// vfioEverywhere offers every GPU for passthrough.
func vfioEverywhere(mode devicemodel.VFIOMode) devicemodel.Option {
	return devicemodel.WithVFIO(mode, func(g hardware.GPU) (devicemodel.VFIOInfo, bool) {
		return devicemodel.VFIOInfo{VendorID: "0x10de", DeviceID: "0x2330", IOMMUGroup: 20 + g.Index}, true
	})
}

// TestValidationRejects makes sure the validation above can fail, on the
// rules the driver could break.
func TestValidationRejects(t *testing.T) {
	inv := &hardware.Inventory{DriverVersion: "580.65.06", CUDADriverVersion: "13.0",
		GPUs: []hardware.GPU{migGPU(t, 0, "H100-SXM5-80GB", true)}}
	m, err := devicemodel.Build(inv, devicemodel.WithDynamicMIG())
	if err != nil {
		t.Fatal(err)
	}
	objs := sliceObjects("node-0", driverName, m.DriverResources("node-0"))
	if len(objs) < 2 || objs[0].Spec.SharedCounters == nil || objs[1].Spec.Devices == nil {
		t.Fatalf("want a counter set slice, then devices; got %d slices", len(objs))
	}
	tests := []struct {
		name   string
		mutate func(counters, devices *resourceapi.ResourceSlice) *resourceapi.ResourceSlice
		want   string
	}{
		{"upper-case counter", func(c, _ *resourceapi.ResourceSlice) *resourceapi.ResourceSlice {
			c.Spec.SharedCounters[0].Counters["copyEngines"] = resourceapi.Counter{Value: apiresource.MustParse("1")}
			return c
		}, "copyEngines"},
		{"upper-case counter set", func(c, _ *resourceapi.ResourceSlice) *resourceapi.ResourceSlice {
			c.Spec.SharedCounters[0].Name = "GPU-0"
			return c
		}, "GPU-0"},
		{"nine counter sets", func(c, _ *resourceapi.ResourceSlice) *resourceapi.ResourceSlice {
			for i := range 8 {
				set := *c.Spec.SharedCounters[0].DeepCopy()
				set.Name = fmt.Sprintf("gpu-%d-counters", i+1)
				c.Spec.SharedCounters = append(c.Spec.SharedCounters, set)
			}
			return c
		}, "sharedCounters"},
		{"counters and devices in one slice", func(c, d *resourceapi.ResourceSlice) *resourceapi.ResourceSlice {
			d.Spec.SharedCounters = c.Spec.SharedCounters
			return d
		}, "only one of"},
		{"65 devices consuming counters", func(_, d *resourceapi.ResourceSlice) *resourceapi.ResourceSlice {
			for len(d.Spec.Devices) < 65 {
				dev := *d.Spec.Devices[0].DeepCopy()
				dev.Name = fmt.Sprintf("extra-%d", len(d.Spec.Devices))
				d.Spec.Devices = append(d.Spec.Devices, dev)
			}
			return d
		}, "64"},
		{"three consumptions", func(_, d *resourceapi.ResourceSlice) *resourceapi.ResourceSlice {
			c := d.Spec.Devices[0].ConsumesCounters[0]
			for i := range 2 {
				c.CounterSet = fmt.Sprintf("gpu-%d-counters", i+1)
				d.Spec.Devices[0].ConsumesCounters = append(d.Spec.Devices[0].ConsumesCounters, *c.DeepCopy())
			}
			return d
		}, "consumesCounters"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			obj := tt.mutate(objs[0].DeepCopy(), objs[1].DeepCopy())
			errs := validateCreate(t, obj)
			for _, err := range errs {
				if strings.Contains(err.Error(), tt.want) {
					return
				}
			}
			t.Errorf("errors %v do not mention %q", errs, tt.want)
		})
	}
}

// validateCreate does to obj what the API server does on create before
// storing it, and returns the errors; a field the server would drop
// counts as one.
func validateCreate(t *testing.T, obj *resourceapi.ResourceSlice) field.ErrorList {
	t.Helper()
	ctx := genericapirequest.WithRequestInfo(context.Background(), &genericapirequest.RequestInfo{
		IsResourceRequest: true, Verb: "create", APIGroup: resourceapi.GroupName, APIVersion: "v1", Resource: "resourceslices", Name: obj.Name,
	})
	versioned := obj.DeepCopy()
	legacyscheme.Scheme.Default(versioned)
	internal := &resource.ResourceSlice{}
	if err := legacyscheme.Scheme.Convert(versioned, internal, nil); err != nil {
		t.Fatalf("convert %s to the internal API: %v", obj.Name, err)
	}
	prepared := internal.DeepCopy()
	sliceregistry.Strategy.PrepareForCreate(ctx, prepared)
	var errs field.ErrorList
	if !apiequality.Semantic.DeepEqual(prepared.Spec, internal.Spec) {
		errs = append(errs, field.Forbidden(field.NewPath("spec"), "the API server drops fields of this slice under the default feature gates"))
	}
	return append(errs, rest.ValidateCreate(ctx, prepared, sliceregistry.Strategy)...)
}

// sliceObjects turns a driver's pools into the ResourceSlices the
// resourceslice controller would create for the node.
func sliceObjects(node, driver string, res resourceslice.DriverResources) []*resourceapi.ResourceSlice {
	var out []*resourceapi.ResourceSlice
	for poolName, pool := range res.Pools {
		for i, s := range pool.Slices {
			out = append(out, &resourceapi.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", node, driver, i)},
				Spec: resourceapi.ResourceSliceSpec{
					Driver:         driver,
					Pool:           resourceapi.ResourcePool{Name: poolName, Generation: 1, ResourceSliceCount: int64(len(pool.Slices))},
					NodeName:       ptr.To(node),
					Devices:        s.Devices,
					SharedCounters: s.SharedCounters,
				},
			})
		}
	}
	return out
}

// builtinNodes discovers every node of every built-in fleet, with the
// MIG profiles of the simulator's tables where discovery leaves them out.
func builtinNodes(t *testing.T) []inventory {
	t.Helper()
	var out []inventory
	for _, name := range simfleet.BuiltinNames() {
		f, err := simfleet.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, nodeName := range f.NodeNames() {
			n, err := f.Node(nodeName)
			if err != nil {
				t.Fatal(err)
			}
			inv, err := n.Hardware().Discover(context.Background())
			if err != nil {
				t.Fatalf("%s/%s: Discover: %v", name, nodeName, err)
			}
			for i := range inv.GPUs {
				g := &inv.GPUs[i]
				m := model(t, n.GPUs[i].Model)
				if len(m.MIGProfiles) > 0 && len(g.MIGProfiles) == 0 {
					g.MIGCapable, g.MIGMemorySlices, g.MIGProfiles = true, m.MemorySlices, profiles(m)
				}
			}
			out = append(out, inventory{name + "/" + nodeName, inv})
		}
	}
	return out
}

// handBuiltNodes are MIG nodes the fleets do not have: each MIG model in
// and out of MIG mode, existing MIG devices at every kind of placement,
// and more GPUs than one slice holds counter sets for.
func handBuiltNodes(t *testing.T) []inventory {
	t.Helper()
	inv := func(gpus ...hardware.GPU) *hardware.Inventory {
		return &hardware.Inventory{DriverVersion: "580.65.06", CUDADriverVersion: "13.0", GPUs: gpus}
	}
	var out []inventory
	for _, name := range sim.ModelNames() {
		if len(model(t, name).MIGProfiles) == 0 {
			continue
		}
		out = append(out, inventory{"model-" + name, inv(migGPU(t, 0, name, true), migGPU(t, 1, name, false))})
	}

	existing := migGPU(t, 0, "H100-SXM5-80GB", true)
	at := map[string]int{"1g.20gb": 0, "2g.20gb": 2, "3g.40gb": 4} // a full, legal layout
	for _, p := range existing.MIGProfiles {
		start, ok := at[p.Name]
		if !ok {
			continue
		}
		existing.MIGDevices = append(existing.MIGDevices, hardware.MIGDevice{
			UUID: fmt.Sprintf("MIG-%08d-0000-0000-0000-000000000000", len(existing.MIGDevices)), Profile: p.Name,
			GIProfileID: p.GIProfileID, ProfileID: p.ProfileID, CIProfileID: p.CIProfileID,
			PlacementStart: start, PlacementSize: p.PlacementSize, MemoryBytes: p.MemoryBytes,
			Multiprocessors: p.Multiprocessors, CopyEngines: p.CopyEngines, Decoders: p.Decoders,
			Encoders: p.Encoders, JPEGEngines: p.JPEGEngines, OFAEngines: p.OFAEngines,
		})
	}
	if len(existing.MIGDevices) != len(at) {
		t.Fatalf("%d existing MIG devices, want %d", len(existing.MIGDevices), len(at))
	}
	out = append(out, inventory{"existing-mig-devices", inv(existing, migGPU(t, 1, "L40S", false))})

	var big []hardware.GPU
	for i := range 19 {
		big = append(big, migGPU(t, i, []string{"H100-SXM5-80GB", "H200-SXM5-141GB", "A100-SXM4-80GB"}[i%3], i%4 != 0))
	}
	out = append(out, inventory{"19-gpus", inv(big...)})
	return out
}

// migGPU is a GPU of a simulated model as discovery reports it.
func migGPU(t *testing.T, index int, name string, migEnabled bool) hardware.GPU {
	t.Helper()
	m := model(t, name)
	g := hardware.GPU{
		Index: index, Minor: index,
		UUID:        fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", index),
		ProductName: m.ProductName, Brand: "Nvidia", Architecture: "Hopper",
		CUDAComputeCapability: fmt.Sprintf("%d.%d", m.CCMajor, m.CCMinor),
		MemoryBytes:           m.MemoryMiB << 20,
		PCIBusID:              fmt.Sprintf("%04x:%02x:00.0", index/8, 0x10+index%8*0x10),
		PCIeRoot:              fmt.Sprintf("pci%04x:%02x", index/8, index%8/2*0x20),
		NUMANode:              ptr.To(index % 2),
	}
	if len(m.MIGProfiles) > 0 {
		g.MIGCapable, g.MIGEnabled, g.MIGMemorySlices, g.MIGProfiles = true, migEnabled, m.MemorySlices, profiles(m)
	}
	return g
}

func model(t *testing.T, name string) sim.Model {
	t.Helper()
	m, ok := sim.LookupModel(name)
	if !ok {
		t.Fatalf("no simulated model %q", name)
	}
	return m
}

// profiles converts a simulated model's MIG profile table into the
// inventory's form.
func profiles(m sim.Model) []hardware.MIGProfile {
	out := make([]hardware.MIGProfile, len(m.MIGProfiles))
	for i, p := range m.MIGProfiles {
		out[i] = hardware.MIGProfile{
			Name: p.Name, GIProfileID: p.GIProfile, ProfileID: p.ID, CIProfileID: p.CIProfile,
			Slices: p.Slices, Instances: p.Instances, MemoryBytes: p.MemoryMiB << 20,
			Multiprocessors: p.Multiprocessors, CopyEngines: p.CopyEngines, Decoders: p.Decoders,
			Encoders: p.Encoders, JPEGEngines: p.JPEGEngines, OFAEngines: p.OFAEngines,
			PlacementSize: p.PlacementSize, PlacementStarts: slices.Clone(p.PlacementStarts),
		}
	}
	return out
}

func hasMIGCapable(inv *hardware.Inventory) bool {
	return slices.ContainsFunc(inv.GPUs, func(g hardware.GPU) bool { return len(g.MIGProfiles) > 0 && g.MIGMemorySlices > 0 })
}
