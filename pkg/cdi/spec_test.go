package cdi_test

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

const (
	driver   = "gpu.nvidia.com"
	claimUID = "6f1c2a93-4e57-4b0d-9a11-3c8e2071d45b"
)

// node is the simulated DGX A100 with MIG devices: GPU 1 (minor 1) holds
// 1g.5gb, 2g.10gb and 3g.20gb devices, GPUs 4-7 are full GPUs.
type node struct {
	inv   *hardware.Inventory
	model *devicemodel.Model
}

func loadNode(t *testing.T) node {
	t.Helper()
	inv, err := simfleet.Discover(context.Background(), "dgx-a100-mig", "dgx-a100-0")
	if err != nil {
		t.Fatal(err)
	}
	m, err := devicemodel.Build(inv)
	if err != nil {
		t.Fatal(err)
	}
	return node{inv: inv, model: m}
}

func (n node) devices(t *testing.T, names ...string) []*devicemodel.Device {
	t.Helper()
	var out []*devicemodel.Device
	for _, name := range names {
		d, ok := n.model.Lookup(name)
		if !ok {
			t.Fatalf("no device %s on the node", name)
		}
		out = append(out, d)
	}
	return out
}

// devNode is the part of a device node that matters to a runtime.
type devNode struct {
	path         string
	typ          string
	major, minor int64
}

func (d devNode) String() string { return fmt.Sprintf("%s %s %d:%d", d.path, d.typ, d.major, d.minor) }

func nodesOf(ns []*cdispec.DeviceNode) []devNode {
	var out []devNode
	for _, n := range ns {
		out = append(out, devNode{n.Path, n.Type, n.Major, n.Minor})
	}
	return out
}

// The majors of a simulated node.
const (
	nvidiaMajor = 195
	uvmMajor    = sim.UVMMajor
	capsMajor   = sim.CapsMajor
)

var controlNodes = []devNode{
	{"/dev/nvidiactl", "c", nvidiaMajor, 255},
	{"/dev/nvidia-uvm", "c", uvmMajor, 0},
	{"/dev/nvidia-uvm-tools", "c", uvmMajor, 1},
}

// migCap is the driver's /proc/driver/nvidia-caps/mig-minors numbering:
// gpu<g>/gi<i>/access is 3 + 135g + 9i, its ci<c>/access that plus 1 + c.
func migCap(gpuMinor, gi int) int64 { return int64(3 + 135*gpuMinor + 9*gi) }

// wantNodes is what a device needs: its GPU's node and, for a MIG device,
// the access nodes of its GPU and compute instance.
func wantNodes(d *devicemodel.Device) []devNode {
	out := []devNode{{fmt.Sprintf("/dev/nvidia%d", d.GPU.Minor), "c", nvidiaMajor, int64(d.GPU.Minor)}}
	if d.MIG != nil {
		gi := migCap(d.GPU.Minor, d.MIG.GIID)
		ci := gi + 1 + int64(d.MIG.CIID)
		out = append(out,
			devNode{fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", gi), "c", capsMajor, gi},
			devNode{fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", ci), "c", capsMajor, ci})
	}
	return out
}

func TestNames(t *testing.T) {
	tests := []struct {
		driver, vendor, kind, id string
	}{
		{"gpu.nvidia.com", "k8s.gpu.nvidia.com", "k8s.gpu.nvidia.com/claim", "k8s.gpu.nvidia.com/claim=" + claimUID + "-gpu-4"},
		{"gpu.example.com", "k8s.gpu.example.com", "k8s.gpu.example.com/claim", "k8s.gpu.example.com/claim=" + claimUID + "-gpu-4"},
	}
	for _, tt := range tests {
		t.Run(tt.driver, func(t *testing.T) {
			if got := cdi.Vendor(tt.driver); got != tt.vendor {
				t.Errorf("Vendor = %q, want %q", got, tt.vendor)
			}
			if got := cdi.Kind(tt.driver); got != tt.kind {
				t.Errorf("Kind = %q, want %q", got, tt.kind)
			}
			id := cdi.DeviceID(tt.driver, claimUID, "gpu-4")
			if id != tt.id {
				t.Errorf("DeviceID = %q, want %q", id, tt.id)
			}
			// The CDI library must accept what we hand the kubelet.
			vendor, class, name, err := parser.ParseQualifiedName(id)
			if err != nil {
				t.Fatalf("ParseQualifiedName(%q): %v", id, err)
			}
			if vendor != tt.vendor || class != cdi.Class || name != cdi.DeviceName(claimUID, "gpu-4") {
				t.Errorf("parsed %q as %q %q %q", id, vendor, class, name)
			}
		})
	}
	// Long MIG names of a claim stay valid CDI device names.
	id := cdi.DeviceID(driver, claimUID, "gpu-31-mig-1g10gb-me-20-6")
	if _, _, _, err := parser.ParseQualifiedName(id); err != nil {
		t.Errorf("ParseQualifiedName(%q): %v", id, err)
	}
}

func TestBuildSpec(t *testing.T) {
	n := loadNode(t)
	majors := n.inv.Majors
	if majors != (hardware.Majors{NVIDIA: nvidiaMajor, UVM: uvmMajor, Caps: capsMajor, IMEXChannels: sim.IMEXChannelsMajor}) {
		t.Fatalf("simulated majors %+v", majors)
	}
	tests := []struct {
		name    string
		devices []string
		// known pins the cap minors of some MIG devices, so that the test
		// does not only check the formula against itself.
		known map[string][2]int64
	}{
		{name: "full GPU", devices: []string{"gpu-4"}},
		{name: "MIG device", devices: []string{"gpu-1-mig-3g20gb-9-4"}, known: map[string][2]int64{"gpu-1-mig-3g20gb-9-4": {156, 157}}},
		{
			name:    "full GPU and MIG devices, in order",
			devices: []string{"gpu-7", "gpu-1-mig-2g10gb-14-0", "gpu-0-mig-1g5gb-19-6", "gpu-4"},
			known:   map[string][2]int64{"gpu-1-mig-2g10gb-14-0": {165, 166}},
		},
		{name: "two MIG devices of one GPU", devices: []string{"gpu-0-mig-1g5gb-19-0", "gpu-0-mig-1g5gb-19-1"}},
		{name: "7g MIG device", devices: []string{"gpu-3-mig-7g40gb-0-0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			devs := n.devices(t, tt.devices...)
			spec, err := cdi.BuildSpec(cdi.SpecInput{DriverName: driver, ClaimUID: claimUID, Majors: majors, Devices: cdi.Whole(devs...)})
			if err != nil {
				t.Fatalf("BuildSpec: %v", err)
			}
			if spec.Kind != "k8s.gpu.nvidia.com/claim" {
				t.Errorf("kind %q", spec.Kind)
			}
			if err := cdispec.ValidateVersion(spec); err != nil {
				t.Errorf("version %q: %v", spec.Version, err)
			}
			if got := nodesOf(spec.ContainerEdits.DeviceNodes); !reflect.DeepEqual(got, controlNodes) {
				t.Errorf("spec-wide device nodes %v, want %v", got, controlNodes)
			}
			if want := []string{"NVIDIA_VISIBLE_DEVICES=void"}; !reflect.DeepEqual(spec.ContainerEdits.Env, want) {
				t.Errorf("spec-wide env %q, want %q", spec.ContainerEdits.Env, want)
			}
			if len(spec.Devices) != len(devs) {
				t.Fatalf("%d CDI devices, want %d", len(spec.Devices), len(devs))
			}
			for i, d := range devs {
				got := spec.Devices[i]
				if want := claimUID + "-" + d.Name(); got.Name != want {
					t.Errorf("device %d: name %q, want %q", i, got.Name, want)
				}
				if !strings.Contains(got.Name, claimUID) {
					t.Errorf("device %d: name %q lacks the claim UID", i, got.Name)
				}
				if gotNodes, want := nodesOf(got.ContainerEdits.DeviceNodes), wantNodes(d); !reflect.DeepEqual(gotNodes, want) {
					t.Errorf("%s: device nodes %v, want %v", d.Name(), gotNodes, want)
				}
				if k, ok := tt.known[d.Name()]; ok {
					if nodes := got.ContainerEdits.DeviceNodes; len(nodes) != 3 || nodes[1].Minor != k[0] || nodes[2].Minor != k[1] {
						t.Errorf("%s: cap nodes %v, want minors %d and %d", d.Name(), nodesOf(nodes), k[0], k[1])
					}
				}
				if len(got.ContainerEdits.Env) != 0 || len(got.ContainerEdits.Mounts) != 0 || len(got.ContainerEdits.Hooks) != 0 {
					t.Errorf("%s: unexpected per-device edits %+v", d.Name(), got.ContainerEdits)
				}
			}
		})
	}
}

func TestBuildSpecCommonEdits(t *testing.T) {
	n := loadNode(t)
	commonEdits := func() *cdispec.ContainerEdits {
		env := make([]string, 1, 8) // spare capacity: an append would write into it
		env[0] = "NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu"
		nodes := make([]*cdispec.DeviceNode, 1, 8)
		nodes[0] = &cdispec.DeviceNode{Path: "/dev/nvidia-modeset", Type: "c", Major: 195, Minor: 254}
		return &cdispec.ContainerEdits{
			Env:         env,
			DeviceNodes: nodes,
			Mounts:      []*cdispec.Mount{{HostPath: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06", ContainerPath: "/usr/lib/x86_64-linux-gnu/libcuda.so.580.65.06", Options: []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}}},
			Hooks:       []*cdispec.Hook{{HookName: "createContainer", Path: "/usr/bin/nvidia-cdi-hook", Args: []string{"nvidia-cdi-hook", "update-ldcache"}}},
		}
	}
	common := commonEdits()
	pristine := commonEdits()
	in := cdi.SpecInput{DriverName: driver, ClaimUID: claimUID, Majors: n.inv.Majors, Devices: cdi.Whole(n.devices(t, "gpu-4")...), Common: common}

	spec1, err := cdi.BuildSpec(in)
	if err != nil {
		t.Fatal(err)
	}
	in.ClaimUID = "second-claim"
	spec2, err := cdi.BuildSpec(in)
	if err != nil {
		t.Fatal(err)
	}

	if !reflect.DeepEqual(common, pristine) {
		t.Errorf("BuildSpec changed the caller's edits:\n got %+v\nwant %+v", common, pristine)
	}
	if spare := common.Env[:cap(common.Env)][1]; spare != "" {
		t.Errorf("BuildSpec appended %q into the spare capacity of the caller's env", spare)
	}
	if spare := common.DeviceNodes[:cap(common.DeviceNodes)][1]; spare != nil {
		t.Errorf("BuildSpec appended %v into the spare capacity of the caller's device nodes", spare)
	}
	for _, spec := range []*cdispec.Spec{spec1, spec2} {
		edits := spec.ContainerEdits
		if want := []string{"NVIDIA_CTK_LIBCUDA_DIR=/usr/lib/x86_64-linux-gnu", "NVIDIA_VISIBLE_DEVICES=void"}; !reflect.DeepEqual(edits.Env, want) {
			t.Errorf("env %q, want %q", edits.Env, want)
		}
		want := append([]devNode{{"/dev/nvidia-modeset", "c", 195, 254}}, controlNodes...)
		if got := nodesOf(edits.DeviceNodes); !reflect.DeepEqual(got, want) {
			t.Errorf("device nodes %v, want %v", got, want)
		}
		if !reflect.DeepEqual(edits.Mounts, pristine.Mounts) || !reflect.DeepEqual(edits.Hooks, pristine.Hooks) {
			t.Errorf("mounts or hooks not carried over: %+v %+v", edits.Mounts, edits.Hooks)
		}
	}
	// The two specs do not share lists either.
	spec1.ContainerEdits.Env[0] = "changed"
	spec1.ContainerEdits.DeviceNodes[0] = nil
	if spec2.ContainerEdits.Env[0] == "changed" || spec2.ContainerEdits.DeviceNodes[0] == nil || common.Env[0] == "changed" {
		t.Error("specs built from the same common edits share their env or device node lists")
	}
}

func TestBuildSpecErrors(t *testing.T) {
	n := loadNode(t)
	full := n.devices(t, "gpu-4")
	mig := n.devices(t, "gpu-4", "gpu-1-mig-3g20gb-9-4")
	tests := []struct {
		name    string
		majors  hardware.Majors
		devices []*devicemodel.Device
		wantErr string // "" for success
	}{
		{"nvidia major unknown", hardware.Majors{UVM: uvmMajor, Caps: capsMajor}, full, "device majors unknown (nvidia=0, nvidia-uvm=509)"},
		{"uvm major unknown", hardware.Majors{NVIDIA: nvidiaMajor, Caps: capsMajor}, full, "device majors unknown (nvidia=195, nvidia-uvm=0)"},
		{"caps major unknown, MIG device", hardware.Majors{NVIDIA: nvidiaMajor, UVM: uvmMajor}, mig, "device gpu-1-mig-3g20gb-9-4: nvidia-caps major unknown"},
		{"caps major unknown, full GPUs only", hardware.Majors{NVIDIA: nvidiaMajor, UVM: uvmMajor}, full, ""},
		{"nothing known", hardware.Majors{}, nil, "device majors unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, err := cdi.BuildSpec(cdi.SpecInput{DriverName: driver, ClaimUID: claimUID, Majors: tt.majors, Devices: cdi.Whole(tt.devices...)})
			if tt.wantErr == "" {
				if err != nil || spec == nil {
					t.Fatalf("BuildSpec = %v, %v", spec, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
			if spec != nil {
				t.Errorf("spec %+v returned with an error", spec)
			}
		})
	}
}

// TestBuildSpecSharesAndVFIO: each share of a device gets a CDI device of
// its own, named with the share ID, with its edits; a claim of VFIO devices
// only gets the nodes its edits name and none of the NVIDIA driver's.
func TestBuildSpecSharesAndVFIO(t *testing.T) {
	n := loadNode(t)
	gpu := n.devices(t, "gpu-4")[0]
	mps := &cdispec.ContainerEdits{Env: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"}}
	spec, err := cdi.BuildSpec(cdi.SpecInput{DriverName: driver, ClaimUID: claimUID, Majors: n.inv.Majors, Devices: []cdi.SpecDevice{
		{Device: gpu, ShareID: "share-a", Edits: mps},
		{Device: gpu, ShareID: "share-b"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(spec.Devices) != 2 || spec.Devices[0].Name != cdi.DeviceName(claimUID, "gpu-4-share-a") || spec.Devices[1].Name != cdi.DeviceName(claimUID, "gpu-4-share-b") {
		t.Fatalf("devices %+v, want one per share", spec.Devices)
	}
	if env := spec.Devices[0].ContainerEdits.Env; len(env) != 1 || env[0] != mps.Env[0] || len(spec.Devices[1].ContainerEdits.Env) != 0 {
		t.Errorf("share edits: %v and %v, want the MPS env on share-a only", env, spec.Devices[1].ContainerEdits.Env)
	}

	vfioDev := *gpu
	vfioDev.Kind = devicemodel.KindVFIO
	vfioDev.API.Name = "gpu-vfio-4"
	group := &cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/vfio/23", Type: "c", Major: 243, Minor: 0}}}
	spec, err = cdi.BuildSpec(cdi.SpecInput{DriverName: driver, ClaimUID: claimUID, Devices: []cdi.SpecDevice{{Device: &vfioDev, Edits: group}}})
	if err != nil {
		t.Fatalf("VFIO claim without NVIDIA majors: %v", err)
	}
	var paths []string
	for _, d := range append(spec.ContainerEdits.DeviceNodes, spec.Devices[0].ContainerEdits.DeviceNodes...) {
		paths = append(paths, d.Path)
	}
	if len(paths) != 1 || paths[0] != "/dev/vfio/23" || len(spec.ContainerEdits.Env) != 0 {
		t.Errorf("VFIO claim's nodes %v, env %v; want only /dev/vfio/23", paths, spec.ContainerEdits.Env)
	}
}

// TestSpecVersionIsTheSameForEveryClaim: a claim UID that starts with a
// digit (which the CDI spec 0.5.0 first allows in device names) and one
// that starts with a letter get specs of the same version, with and
// without the claim annotations, so that runtimes see one version.
func TestSpecVersionIsTheSameForEveryClaim(t *testing.T) {
	n := loadNode(t)
	versions := map[string]string{}
	for _, uid := range []string{"0a1b2c3d-0000-4000-8000-000000000001", "ab1b2c3d-0000-4000-8000-000000000002"} {
		for _, names := range [][]string{{"gpu-4"}, {"gpu-0-mig-1g5gb-19-0"}} {
			spec, err := cdi.BuildSpec(cdi.SpecInput{DriverName: "gpu.nvidia.com", ClaimUID: uid, Majors: n.inv.Majors, Devices: cdi.Whole(n.devices(t, names...)...)})
			if err != nil {
				t.Fatal(err)
			}
			versions[uid[:1]+" "+names[0]+" built"] = spec.Version
			if err := cdi.SetClaim(spec, []cdi.DeviceIdentity{{Name: names[0]}}, nil); err != nil {
				t.Fatal(err)
			}
			versions[uid[:1]+" "+names[0]+" with annotations"] = spec.Version
		}
	}
	for k, v := range versions {
		if v != cdi.SpecVersion {
			t.Errorf("%s: version %s, want %s for every claim", k, v, cdi.SpecVersion)
		}
	}
}
