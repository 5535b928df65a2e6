package devicemodel_test

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ from the current output")

// h100MIGFleet is an H100 node with pre-created MIG devices of every kind
// of name: a "+me" profile, a 2-memory-slice 1g profile, a full-GPU
// instance on a GPU whose minor differs from its index, a MIG-enabled GPU
// without MIG devices, and a full GPU without NUMA affinity. It also runs a
// newer-than-default driver, so that the version attributes are not only
// ever the defaults.
const h100MIGFleet = `
nodes:
- name: h100-mig-0
  driverVersion: "570.133.20"
  cudaDriverVersion: "12.8"
  gpus:
  - model: H100-SXM5-80GB
    migEnabled: true
    migDevices:
    - {profile: 3g.40gb, placementStart: 4}
    - {profile: 2g.20gb, placementStart: 0}
    - {profile: 1g.10gb, placementStart: 2}
    - {profile: 1g.10gb+me, placementStart: 3}
  - model: H100-SXM5-80GB
    migEnabled: true
    migDevices:
    - {profile: 1g.20gb, placementStart: 6}
    - {profile: 4g.40gb, placementStart: 0}
    - {profile: 1g.20gb, placementStart: 4}
  - model: H100-SXM5-80GB
    minor: 7
    migEnabled: true
    migDevices:
    - {profile: 7g.80gb}
  - model: H100-SXM5-80GB
    migEnabled: true
  - model: H100-SXM5-80GB
    minor: 12
    numaNode: -1
`

func builtin(name string) func(*testing.T) *simfleet.Fleet {
	return func(t *testing.T) *simfleet.Fleet {
		t.Helper()
		f, err := simfleet.Load(name)
		if err != nil {
			t.Fatalf("simfleet.Load(%q): %v", name, err)
		}
		return f
	}
}

func parsed(data string) func(*testing.T) *simfleet.Fleet {
	return func(t *testing.T) *simfleet.Fleet {
		t.Helper()
		f, err := simfleet.Parse([]byte(data), t.Name())
		if err != nil {
			t.Fatalf("simfleet.Parse: %v", err)
		}
		return f
	}
}

func discover(t *testing.T, f *simfleet.Fleet, node string) *hardware.Inventory {
	t.Helper()
	n, err := f.Node(node)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := n.Hardware().Discover(context.Background())
	if err != nil {
		t.Fatalf("Discover %s: %v", node, err)
	}
	return inv
}

func build(t *testing.T, inv *hardware.Inventory) *devicemodel.Model {
	t.Helper()
	m, err := devicemodel.Build(inv)
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return m
}

// goldenCases are the nodes whose published devices are pinned in testdata.
var goldenCases = []struct {
	golden string
	fleet  func(*testing.T) *simfleet.Fleet
	node   string
}{
	{"dgx-a100", builtin("dgx-a100"), "dgx-a100-0"},
	{"dgx-h100", builtin("dgx-h100"), "dgx-h100-0"},
	{"dgx-a100-mig", builtin("dgx-a100-mig"), "dgx-a100-0"},
	{"h100-mig", parsed(h100MIGFleet), "h100-mig-0"},
}

// TestGoldenDevices pins the published devices, byte for byte, as
// sigs.k8s.io/yaml prints them. Run with -update to rewrite the files,
// then read the diff: the figures must be NVIDIA's (see
// TestPublishedDevices, which checks them independently).
func TestGoldenDevices(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.golden, func(t *testing.T) {
			m := build(t, discover(t, tc.fleet(t), tc.node))
			checkGolden(t, tc.golden, "devices", m.APIDevices())
		})
	}
}

// checkGolden compares v, as YAML, with testdata/<name>.golden.yaml, or
// with -update rewrites the file; what names the content in messages.
func checkGolden(t *testing.T, name, what string, v any) {
	t.Helper()
	got, err := yaml.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", name+".golden.yaml")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differ from %s (go test -update rewrites it):\n%s", what, path, lineDiff(string(want), string(got)))
	}
}

// lineDiff names the first lines that differ, which is enough to find a
// change in a golden file.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var out []string
	for i := 0; i < max(len(w), len(g)) && len(out) < 10; i++ {
		var wl, gl string
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if wl != gl {
			out = append(out, "line "+strconv.Itoa(i+1)+":\n  want: "+wl+"\n  got:  "+gl)
		}
	}
	return strings.Join(out, "\n")
}

// The attribute names and types of NVIDIA's DRA driver, which CEL
// selectors written for it depend on: a string compared with a version
// never matches.
var (
	gpuAttributeTypes = map[resourceapi.QualifiedName]string{
		"type":                            "string",
		"uuid":                            "string",
		"productName":                     "string",
		"brand":                           "string",
		"architecture":                    "string",
		"cudaComputeCapability":           "version",
		"driverVersion":                   "version",
		"cudaDriverVersion":               "version",
		"index":                           "int",
		"minor":                           "int",
		"resource.kubernetes.io/pciBusID": "string",
		"resource.kubernetes.io/pcieRoot": "string",
		"resource.kubernetes.io/numaNode": "int",
		// gpudra's own, on full GPUs only.
		"sharingMode": "string",
	}
	// A MIG device has neither index nor minor of its own; publishing the
	// parent's under those names would mislead (NVIDIA's older driver used
	// them for the MIG device itself).
	migAttributeTypes = withoutIndexMinor(merge(gpuAttributeTypes, map[resourceapi.QualifiedName]string{
		"parentUUID": "string",
		"profile":    "string",
	}))
	gpuCapacities = []resourceapi.QualifiedName{"memory"}
	migCapacities = []resourceapi.QualifiedName{"copyEngines", "decoders", "encoders", "jpegEngines", "memory", "multiprocessors", "ofaEngines"}
)

func withoutIndexMinor(m map[resourceapi.QualifiedName]string) map[resourceapi.QualifiedName]string {
	delete(m, "index")
	delete(m, "minor")
	delete(m, "sharingMode") // MIG devices are never shared
	return m
}

func merge(a, b map[resourceapi.QualifiedName]string) map[resourceapi.QualifiedName]string {
	out := map[resourceapi.QualifiedName]string{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

func attrType(a resourceapi.DeviceAttribute) string {
	var types []string
	if a.StringValue != nil {
		types = append(types, "string")
	}
	if a.VersionValue != nil {
		types = append(types, "version")
	}
	if a.IntValue != nil {
		types = append(types, "int")
	}
	if a.BoolValue != nil {
		types = append(types, "bool")
	}
	if a.IntValues != nil || a.BoolValues != nil || a.StringValues != nil || a.VersionValues != nil {
		types = append(types, "list")
	}
	return strings.Join(types, "+")
}

// migFigures are what `nvidia-smi mig -lgip` prints for a GPU instance
// profile on the real GPU (NVIDIA MIG user guide), independent of the
// simulator's tables: the profile ID, memory (GiB with two decimals, here
// in MiB), SM / DEC / ENC and CE / JPEG / OFA.
type migFigures struct {
	profileID                  int
	memory                     string
	sm, dec, enc, ce, jpg, ofa int64
}

var (
	a100SXM440GB = map[string]migFigures{
		"1g.5gb":    {19, "4864Mi", 14, 0, 0, 1, 0, 0}, // 4.75 GiB
		"1g.5gb+me": {20, "4864Mi", 14, 1, 0, 1, 1, 1}, // 4.75 GiB
		"1g.10gb":   {15, "9856Mi", 14, 1, 0, 1, 0, 0}, // 9.62 GiB
		"2g.10gb":   {14, "9856Mi", 28, 1, 0, 2, 0, 0}, // 9.62 GiB
		"3g.20gb":   {9, "19968Mi", 42, 2, 0, 3, 0, 0}, // 19.50 GiB
		"4g.20gb":   {5, "19968Mi", 56, 2, 0, 4, 0, 0}, // 19.50 GiB
		"7g.40gb":   {0, "40192Mi", 98, 5, 0, 7, 1, 1}, // 39.25 GiB
	}
	h10080GBHBM3 = map[string]migFigures{
		"1g.10gb":    {19, "9984Mi", 16, 1, 0, 1, 1, 0},  // 9.75 GiB
		"1g.10gb+me": {20, "9984Mi", 16, 1, 0, 1, 1, 1},  // 9.75 GiB
		"1g.20gb":    {15, "20096Mi", 26, 1, 0, 1, 1, 0}, // 19.62 GiB
		"2g.20gb":    {14, "20096Mi", 32, 2, 0, 2, 2, 0}, // 19.62 GiB
		"3g.40gb":    {9, "40448Mi", 60, 3, 0, 3, 3, 0},  // 39.50 GiB
		"4g.40gb":    {5, "40448Mi", 64, 4, 0, 4, 4, 0},  // 39.50 GiB
		"7g.80gb":    {0, "81152Mi", 132, 7, 0, 8, 7, 1}, // 79.25 GiB
	}
)

// gpuFacts are a product's figures as nvidia-smi and NVML report them.
type gpuFacts struct {
	product, arch, cc, memory string
	mig                       map[string]migFigures
}

var (
	a100 = gpuFacts{"NVIDIA A100-SXM4-40GB", "Ampere", "8.0.0", "40960Mi", a100SXM440GB}
	h100 = gpuFacts{"NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "81559Mi", h10080GBHBM3}
)

// gpuWant is the expected placement of the GPU at one NVML index.
type gpuWant struct {
	minor   int
	busID   string
	root    string
	numa    int // -1: no numaNode attribute
	devices []string
}

func TestPublishedDevices(t *testing.T) {
	dgxA100 := func(i int) gpuWant {
		bus := []string{"07", "0f", "47", "4e", "87", "90", "b7", "bd"}[i]
		root := []string{"00", "40", "80", "a0"}[i/2]
		// Two EPYC sockets in NPS4 mode: eight NUMA nodes.
		numa := []int{3, 3, 1, 1, 7, 7, 5, 5}[i]
		return gpuWant{minor: i, busID: "0000:" + bus + ":00.0", root: "pci0000:" + root, numa: numa}
	}
	dgxH100 := func(i int) gpuWant {
		bus := []string{"1b", "43", "52", "61", "9d", "c3", "d1", "df"}[i]
		root := []string{"15", "48", "97", "c7"}[i/2]
		return gpuWant{minor: i, busID: "0000:" + bus + ":00.0", root: "pci0000:" + root, numa: i / 4}
	}
	with := func(g gpuWant, names ...string) gpuWant { g.devices = names; return g }
	full := func(layout func(int) gpuWant, n int) []gpuWant {
		out := make([]gpuWant, n)
		for i := range out {
			out[i] = with(layout(i), devicemodel.GPUName(i))
		}
		return out
	}

	tests := []struct {
		name          string
		fleet         func(*testing.T) *simfleet.Fleet
		node          string
		facts         gpuFacts
		driverVersion string
		cudaVersion   string
		gpus          []gpuWant // by NVML index
	}{
		{
			name: "dgx-a100", fleet: builtin("dgx-a100"), node: "dgx-a100-0", facts: a100,
			driverVersion: "580.65.6", cudaVersion: "13.0.0",
			gpus: full(dgxA100, 8),
		},
		{
			name: "dgx-h100", fleet: builtin("dgx-h100"), node: "dgx-h100-0", facts: h100,
			driverVersion: "580.65.6", cudaVersion: "13.0.0",
			gpus: full(dgxH100, 8),
		},
		{
			name: "dgx-a100-mig", fleet: builtin("dgx-a100-mig"), node: "dgx-a100-0", facts: a100,
			driverVersion: "580.65.6", cudaVersion: "13.0.0",
			gpus: []gpuWant{
				with(dgxA100(0), "gpu-0-mig-1g5gb-19-0", "gpu-0-mig-1g5gb-19-1", "gpu-0-mig-1g5gb-19-2", "gpu-0-mig-1g5gb-19-3",
					"gpu-0-mig-1g5gb-19-4", "gpu-0-mig-1g5gb-19-5", "gpu-0-mig-1g5gb-19-6"),
				with(dgxA100(1), "gpu-1-mig-1g5gb-19-2", "gpu-1-mig-1g5gb-19-3", "gpu-1-mig-2g10gb-14-0", "gpu-1-mig-3g20gb-9-4"),
				with(dgxA100(2), "gpu-2-mig-3g20gb-9-4", "gpu-2-mig-4g20gb-5-0"),
				with(dgxA100(3), "gpu-3-mig-7g40gb-0-0"),
				with(dgxA100(4), "gpu-4"),
				with(dgxA100(5), "gpu-5"),
				with(dgxA100(6), "gpu-6"),
				with(dgxA100(7), "gpu-7"),
			},
		},
		{
			name: "h100-mig", fleet: parsed(h100MIGFleet), node: "h100-mig-0", facts: h100,
			driverVersion: "570.133.20", cudaVersion: "12.8.0",
			gpus: []gpuWant{
				// Ordered by NVML profile index (1g 0, 2g 1, 3g 2, 4g 3,
				// +me 7, 1g.20gb 9), then placement.
				with(dgxH100(0), "gpu-0-mig-1g10gb-19-2", "gpu-0-mig-2g20gb-14-0", "gpu-0-mig-3g40gb-9-4", "gpu-0-mig-1g10gb-me-20-3"),
				with(dgxH100(1), "gpu-1-mig-4g40gb-5-0", "gpu-1-mig-1g20gb-15-4", "gpu-1-mig-1g20gb-15-6"),
				with(gpuWant{minor: 7, busID: "0000:52:00.0", root: "pci0000:48", numa: 0}, "gpu-7-mig-7g80gb-0-0"),
				// MIG mode on, no MIG devices: nothing to publish, and
				// above all not the full GPU.
				{minor: 3, busID: "0000:61:00.0", root: "pci0000:48", numa: 1},
				with(gpuWant{minor: 12, busID: "0000:9d:00.0", root: "pci0000:97", numa: -1}, "gpu-12"),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv := discover(t, tt.fleet(t), tt.node)
			m := build(t, inv)

			var wantNames []string
			for _, g := range tt.gpus {
				wantNames = append(wantNames, g.devices...)
			}
			var gotNames []string
			for _, d := range m.Devices {
				gotNames = append(gotNames, d.Name())
			}
			if !slices.Equal(gotNames, wantNames) {
				t.Fatalf("device names:\n got %q\nwant %q", gotNames, wantNames)
			}
			if len(inv.GPUs) != len(tt.gpus) {
				t.Fatalf("inventory has %d GPUs, test expects %d", len(inv.GPUs), len(tt.gpus))
			}

			for i := range m.Devices {
				d := &m.Devices[i]
				api := d.API
				gpu := inv.GPUs[d.GPU.Index]
				want := tt.gpus[gpu.Index]
				if d.GPU.UUID != gpu.UUID || gpu.Minor != want.minor {
					t.Errorf("%s: parent GPU %s minor %d, want inventory GPU %d (%s) with minor %d", api.Name, d.GPU.UUID, gpu.Minor, gpu.Index, gpu.UUID, want.minor)
				}
				wantTypes, wantCaps := gpuAttributeTypes, gpuCapacities
				if d.Kind == devicemodel.KindMIG {
					wantTypes, wantCaps = migAttributeTypes, slices.Clone(migCapacities)
					// One memorySlice<N> per memory slice the device occupies.
					for s := d.MIG.PlacementStart; s < d.MIG.PlacementStart+d.MIG.PlacementSize; s++ {
						wantCaps = append(wantCaps, devicemodel.MemorySliceCapacity(s))
					}
					slices.Sort(wantCaps)
				}
				if want.numa < 0 {
					wantTypes = merge(wantTypes, nil)
					delete(wantTypes, "resource.kubernetes.io/numaNode")
				}
				gotTypes := map[resourceapi.QualifiedName]string{}
				for name, a := range api.Attributes {
					gotTypes[name] = attrType(a)
				}
				if !reflect.DeepEqual(gotTypes, wantTypes) {
					t.Errorf("%s: attribute types\n got %v\nwant %v", api.Name, gotTypes, wantTypes)
				}
				var gotCaps []resourceapi.QualifiedName
				for name := range api.Capacity {
					gotCaps = append(gotCaps, name)
				}
				slices.Sort(gotCaps)
				if !slices.Equal(gotCaps, wantCaps) {
					t.Errorf("%s: capacities %v, want %v", api.Name, gotCaps, wantCaps)
				}

				strs := map[resourceapi.QualifiedName]string{
					"productName":                     tt.facts.product,
					"brand":                           "Nvidia",
					"architecture":                    tt.facts.arch,
					"resource.kubernetes.io/pciBusID": want.busID,
					"resource.kubernetes.io/pcieRoot": want.root,
				}
				versions := map[resourceapi.QualifiedName]string{
					"cudaComputeCapability": tt.facts.cc,
					"driverVersion":         tt.driverVersion,
					"cudaDriverVersion":     tt.cudaVersion,
				}
				ints := map[resourceapi.QualifiedName]int64{}
				if d.Kind == devicemodel.KindGPU {
					ints["index"], ints["minor"] = int64(gpu.Index), int64(want.minor)
				}
				if want.numa >= 0 {
					ints["resource.kubernetes.io/numaNode"] = int64(want.numa)
				}
				switch d.Kind {
				case devicemodel.KindGPU:
					strs["type"] = "gpu"
					strs["uuid"] = gpu.UUID
					if d.MIG != nil || gpu.MIGEnabled {
						t.Errorf("%s: full GPU published for a MIG-enabled GPU (or with a MIG device)", api.Name)
					}
					if api.Name != devicemodel.GPUName(want.minor) {
						t.Errorf("%s: full GPU name, want %s", api.Name, devicemodel.GPUName(want.minor))
					}
					checkQuantity(t, api, "memory", tt.facts.memory)
					if got, want := d.UUID(), gpu.UUID; got != want {
						t.Errorf("%s: UUID() = %s, want %s", api.Name, got, want)
					}
				case devicemodel.KindMIG:
					if d.MIG == nil {
						t.Fatalf("%s: MIG device without MIG details", api.Name)
					}
					fig, ok := tt.facts.mig[d.MIG.Profile]
					if !ok {
						t.Fatalf("%s: profile %q is not one of the product's", api.Name, d.MIG.Profile)
					}
					if !gpu.MIGEnabled {
						t.Errorf("%s: MIG device published for a GPU with MIG mode off", api.Name)
					}
					strs["type"] = "mig"
					strs["uuid"] = d.MIG.UUID
					strs["parentUUID"] = gpu.UUID
					strs["profile"] = d.MIG.Profile
					if !regexp.MustCompile(`^MIG-[0-9a-f-]{36}$`).MatchString(d.MIG.UUID) {
						t.Errorf("%s: MIG UUID %q", api.Name, d.MIG.UUID)
					}
					if got := d.UUID(); got != d.MIG.UUID {
						t.Errorf("%s: UUID() = %s, want the MIG UUID %s", api.Name, got, d.MIG.UUID)
					}
					wantName := devicemodel.MIGName(want.minor, d.MIG.Profile, fig.profileID, d.MIG.PlacementStart)
					if api.Name != wantName {
						t.Errorf("%s: name, want %s (NVIDIA's scheme names MIG devices with the profile ID %d)", api.Name, wantName, fig.profileID)
					}
					checkQuantity(t, api, "memory", fig.memory)
					for name, n := range map[resourceapi.QualifiedName]int64{
						"multiprocessors": fig.sm, "decoders": fig.dec, "encoders": fig.enc,
						"copyEngines": fig.ce, "jpegEngines": fig.jpg, "ofaEngines": fig.ofa,
					} {
						checkQuantity(t, api, name, resource.NewQuantity(n, resource.DecimalSI).String())
					}
				default:
					t.Errorf("%s: kind %q", api.Name, d.Kind)
				}
				for name, want := range strs {
					if a := api.Attributes[name]; a.StringValue == nil || *a.StringValue != want {
						t.Errorf("%s: attribute %s = %s, want string %q", api.Name, name, show(a), want)
					}
				}
				for name, want := range versions {
					if a := api.Attributes[name]; a.VersionValue == nil || *a.VersionValue != want {
						t.Errorf("%s: attribute %s = %s, want version %q", api.Name, name, show(a), want)
					}
				}
				for name, want := range ints {
					if a := api.Attributes[name]; a.IntValue == nil || *a.IntValue != want {
						t.Errorf("%s: attribute %s = %s, want int %d", api.Name, name, show(a), want)
					}
				}
				if !regexp.MustCompile(`^GPU-[0-9a-f-]{36}$`).MatchString(gpu.UUID) {
					t.Errorf("%s: GPU UUID %q", api.Name, gpu.UUID)
				}
			}
		})
	}
}

func show(a resourceapi.DeviceAttribute) string {
	b, _ := yaml.Marshal(a)
	return strings.TrimSpace(string(b))
}

func checkQuantity(t *testing.T, d resourceapi.Device, name resourceapi.QualifiedName, want string) {
	t.Helper()
	c, ok := d.Capacity[name]
	if !ok {
		t.Errorf("%s: no capacity %s", d.Name, name)
		return
	}
	if c.Value.Cmp(resource.MustParse(want)) != 0 {
		t.Errorf("%s: capacity %s = %s, want %s", d.Name, name, c.Value.String(), want)
	}
}

// TestDevicesPassAPIValidation checks every device of every built-in
// fleet, and the test fleet, against the API server's rules.
func TestDevicesPassAPIValidation(t *testing.T) {
	type nodeRef struct {
		fleet func(*testing.T) *simfleet.Fleet
		label string
	}
	var refs []nodeRef
	for _, name := range simfleet.BuiltinNames() {
		refs = append(refs, nodeRef{builtin(name), name})
	}
	refs = append(refs, nodeRef{parsed(h100MIGFleet), "h100-mig"})
	for _, ref := range refs {
		t.Run(ref.label, func(t *testing.T) {
			f := ref.fleet(t)
			for _, node := range f.NodeNames() {
				m := build(t, discover(t, f, node))
				devices := m.APIDevices()
				if len(devices) == 0 {
					t.Errorf("%s: no devices", node)
				}
				seen := map[string]bool{}
				for _, d := range devices {
					for _, err := range validateDevice(d) {
						t.Errorf("%s: %v", node, err)
					}
					if seen[d.Name] {
						t.Errorf("%s: device name %s twice", node, d.Name)
					}
					seen[d.Name] = true
					if got, ok := m.Lookup(d.Name); !ok || got.Name() != d.Name {
						t.Errorf("%s: Lookup(%s) = %v, %v", node, d.Name, got, ok)
					}
				}
				for _, s := range devicemodel.Slices(devices) {
					if len(s.Devices) > resourceapi.ResourceSliceMaxDevices {
						t.Errorf("%s: slice of %d devices", node, len(s.Devices))
					}
				}
			}
		})
	}
}

// TestValidateDeviceRejects makes sure the validator above can fail.
func TestValidateDeviceRejects(t *testing.T) {
	many := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	for i := 0; i < 33; i++ {
		many[resourceapi.QualifiedName("a"+strconv.Itoa(i))] = resourceapi.DeviceAttribute{IntValue: ptr.To[int64](1)}
	}
	tests := []struct {
		name   string
		device resourceapi.Device
		want   string
	}{
		{"dot in name", resourceapi.Device{Name: "gpu-0-mig-1g.5gb-19-0"}, "name"},
		{"upper case name", resourceapi.Device{Name: "GPU-0"}, "name"},
		{"name too long", resourceapi.Device{Name: strings.Repeat("a", 64)}, "name"},
		{"too many attributes", resourceapi.Device{Name: "gpu-0", Attributes: many}, "more than 32"},
		{"version not semver", resourceapi.Device{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"driverVersion": {VersionValue: ptr.To("580.65.06")}}}, "not semver"},
		{"two values", resourceapi.Device{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"minor": {IntValue: ptr.To[int64](0), StringValue: ptr.To("0")}}}, "exactly one"},
		{"identifier too long", resourceapi.Device{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			resourceapi.QualifiedName(strings.Repeat("a", 33)): {IntValue: ptr.To[int64](0)}}}, "identifier longer"},
		{"bad domain", resourceapi.Device{Name: "gpu-0", Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			"Not_A.Domain/memory": {Value: resource.MustParse("1")}}}, "capacity"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := validateDevice(tt.device)
			if len(errs) == 0 {
				t.Fatal("no error")
			}
			for _, err := range errs {
				if strings.Contains(err.Error(), tt.want) {
					return
				}
			}
			t.Errorf("errors %v do not mention %q", errs, tt.want)
		})
	}
}

func TestBuildDeterministic(t *testing.T) {
	for _, tc := range goldenCases {
		t.Run(tc.golden, func(t *testing.T) {
			f := tc.fleet(t)
			// Two discoveries, so that nothing is shared between the runs.
			a := build(t, discover(t, f, tc.node)).APIDevices()
			b := build(t, discover(t, f, tc.node)).APIDevices()
			ya, _ := yaml.Marshal(a)
			yb, _ := yaml.Marshal(b)
			if !bytes.Equal(ya, yb) || !reflect.DeepEqual(devicemodel.Slices(a), devicemodel.Slices(b)) {
				t.Errorf("two builds differ:\n%s", lineDiff(string(ya), string(yb)))
			}
		})
	}
}

// TestBuildInventories covers what fleets cannot express: missing
// optional facts and broken ones.
func TestBuildInventories(t *testing.T) {
	base := func() *hardware.Inventory {
		return &hardware.Inventory{
			DriverVersion:     "580.65.06",
			CUDADriverVersion: "13.0",
			Majors:            hardware.Majors{NVIDIA: 195, UVM: 509, Caps: 510},
			GPUs: []hardware.GPU{{
				Index: 0, Minor: 0, UUID: "GPU-11111111-2222-3333-4444-555555555555",
				ProductName: "NVIDIA H100 80GB HBM3", Brand: "Nvidia", Architecture: "Hopper",
				CUDAComputeCapability: "9.0", MemoryBytes: 81559 << 20,
				PCIBusID: "0000:1b:00.0", PCIeRoot: "pci0000:15", NUMANode: ptr.To(0),
			}},
		}
	}
	tests := []struct {
		name    string
		mutate  func(*hardware.Inventory)
		wantErr string // substring; "" for success
		// absent are attributes that must not be published.
		absent []resourceapi.QualifiedName
		names  []string
	}{
		{name: "complete", mutate: func(*hardware.Inventory) {}, names: []string{"gpu-0"}},
		{
			name: "unknown optional facts are left out",
			mutate: func(inv *hardware.Inventory) {
				inv.DriverVersion, inv.CUDADriverVersion = "", ""
				g := &inv.GPUs[0]
				g.Brand, g.Architecture, g.CUDAComputeCapability, g.PCIBusID, g.PCIeRoot, g.NUMANode = "", "", "", "", "", nil
			},
			absent: []resourceapi.QualifiedName{"driverVersion", "cudaDriverVersion", "brand", "architecture", "cudaComputeCapability",
				"resource.kubernetes.io/pciBusID", "resource.kubernetes.io/pcieRoot", "resource.kubernetes.io/numaNode"},
			names: []string{"gpu-0"},
		},
		{
			name: "MIG mode on without MIG devices publishes nothing",
			mutate: func(inv *hardware.Inventory) {
				inv.GPUs[0].MIGCapable, inv.GPUs[0].MIGEnabled = true, true
			},
			names: nil,
		},
		{
			name: "MIG capable but off publishes the full GPU",
			mutate: func(inv *hardware.Inventory) {
				inv.GPUs[0].MIGCapable = true
			},
			names: []string{"gpu-0"},
		},
		{name: "no GPUs", mutate: func(inv *hardware.Inventory) { inv.GPUs = nil }},
		{name: "bad driver version", mutate: func(inv *hardware.Inventory) { inv.DriverVersion = "r580" }, wantErr: "driverVersion"},
		{name: "bad CUDA version", mutate: func(inv *hardware.Inventory) { inv.CUDADriverVersion = "13" }, wantErr: "cudaDriverVersion"},
		{name: "bad compute capability", mutate: func(inv *hardware.Inventory) { inv.GPUs[0].CUDAComputeCapability = "nine" }, wantErr: "cudaComputeCapability"},
		{name: "bus ID not extended BDF", mutate: func(inv *hardware.Inventory) { inv.GPUs[0].PCIBusID = "1b:00.0" }, wantErr: "GPU 0"},
		{name: "negative NUMA node", mutate: func(inv *hardware.Inventory) { inv.GPUs[0].NUMANode = ptr.To(-1) }, wantErr: "NUMA"},
		{
			name: "two GPUs with one minor",
			mutate: func(inv *hardware.Inventory) {
				g := inv.GPUs[0]
				g.Index, g.UUID, g.PCIBusID = 1, "GPU-66666666-2222-3333-4444-555555555555", "0000:43:00.0"
				inv.GPUs = append(inv.GPUs, g)
			},
			wantErr: `"gpu-0" is not unique`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			inv := base()
			tt.mutate(inv)
			m, err := devicemodel.Build(inv)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Build error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Build: %v", err)
			}
			var names []string
			for _, d := range m.Devices {
				names = append(names, d.Name())
				for _, name := range tt.absent {
					if _, ok := d.API.Attributes[name]; ok {
						t.Errorf("%s: attribute %s published for an unknown value", d.Name(), name)
					}
				}
				for _, err := range validateDevice(d.API) {
					t.Error(err)
				}
			}
			if !slices.Equal(names, tt.names) {
				t.Errorf("devices %q, want %q", names, tt.names)
			}
			if _, ok := m.Lookup("gpu-99"); ok {
				t.Error("Lookup of an unknown device succeeded")
			}
		})
	}
}

func TestNames(t *testing.T) {
	tests := []struct {
		got, want string
	}{
		{devicemodel.GPUName(0), "gpu-0"},
		{devicemodel.GPUName(12), "gpu-12"},
		{devicemodel.MIGName(0, "1g.5gb", 19, 6), "gpu-0-mig-1g5gb-19-6"},
		{devicemodel.MIGName(3, "1g.10gb+me", 20, 3), "gpu-3-mig-1g10gb-me-20-3"},
		{devicemodel.MIGName(7, "7g.80gb", 0, 0), "gpu-7-mig-7g80gb-0-0"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}

func TestNormalizeProfile(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"1g.10gb", "1g10gb"},
		{"1g.10gb+me", "1g10gb-me"},
		{"7g.80gb", "7g80gb"},
		{"1g.20gb+gfx", "1g20gb-gfx"},
		{"1G.10GB+ME", "1g10gb-me"},
		{"1c.2g.20gb", "1c2g20gb"},
		{"1g.24gb+me.all", "1g24gb-meall"},
		{"3g.71gb", "3g71gb"},
		{"", ""},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got := devicemodel.NormalizeProfile(tt.in)
			if got != tt.want {
				t.Errorf("NormalizeProfile(%q) = %q, want %q", tt.in, got, tt.want)
			}
			// Every result must fit into a device name.
			if got != "" && !regexp.MustCompile(`^[a-z0-9-]+$`).MatchString(got) {
				t.Errorf("NormalizeProfile(%q) = %q has characters a DNS label cannot", tt.in, got)
			}
		})
	}
}

func TestSemVer(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr bool
	}{
		{in: "580.65.06", want: "580.65.6"},
		{in: "535.104.05", want: "535.104.5"},
		{in: "570.133.20", want: "570.133.20"},
		{in: "9.0", want: "9.0.0"},
		{in: "8.0", want: "8.0.0"},
		{in: "13.0", want: "13.0.0"},
		{in: "12.10", want: "12.10.0"},
		{in: "v12.8", want: "12.8.0"},
		{in: "0.0", want: "0.0.0"},
		{in: "", wantErr: true},
		{in: "13", wantErr: true},
		{in: "abc", wantErr: true},
		{in: "r580.65", wantErr: true},
		{in: "09.0", wantErr: true},
		{in: "1.x", wantErr: true},
		{in: "18446744073709551616.0", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := devicemodel.SemVer(tt.in)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("SemVer(%q) = %q, want an error", tt.in, got)
				}
				if !strings.Contains(err.Error(), tt.in) {
					t.Errorf("error %q does not name the input", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("SemVer(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Errorf("SemVer(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if !semverRE.MatchString(got) {
				t.Errorf("SemVer(%q) = %q, which the API rejects", tt.in, got)
			}
		})
	}
}
