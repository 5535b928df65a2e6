package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/nvmlhw"
)

// rig is the simulated hardware of a one-GPU node, with its fake NVML at
// hand so that tests can ask it what discovery does not show (GPU
// instances without compute instances).
type rig struct {
	nv     *fakeNVML
	hw     *nvmlhw.Discoverer
	faults *Faults
	gpu    string // UUID
}

func newRig(t *testing.T, model string, migEnabled bool, opts ...HardwareOption) *rig {
	t.Helper()
	n := oneGPUNode(t, model, migEnabled)
	faults := &Faults{}
	nv := newFakeNVML(n, append([]HardwareOption{WithFaults(faults)}, opts...)...)
	return &rig{nv: nv, hw: nvmlhw.NewFromInterface(nv, newTopology(n), systemInfo{}), faults: faults, gpu: n.GPUs[0].UUID}
}

func (r *rig) at(profileID, start int) hardware.MIGPlacement {
	return hardware.MIGPlacement{ParentUUID: r.gpu, ProfileID: profileID, Start: start}
}

// instances lists the GPU's GPU instances as NVML reports them, "<profile
// ID>@<start>/<compute instances>", sorted.
func (r *rig) instances(t *testing.T) []string {
	t.Helper()
	dev, _ := r.nv.DeviceGetHandleByIndex(0)
	var out []string
	for i := 0; i < nvml.GPU_INSTANCE_PROFILE_COUNT; i++ {
		info, ret := dev.GetGpuInstanceProfileInfo(i)
		if ret != nvml.SUCCESS {
			continue
		}
		gis, ret := dev.GetGpuInstances(&info)
		if ret == nvml.ERROR_NOT_SUPPORTED { // MIG mode off
			return nil
		}
		if ret != nvml.SUCCESS {
			t.Fatalf("GetGpuInstances(%d): %v", info.Id, ret)
		}
		for _, gi := range gis {
			gii, _ := gi.GetInfo()
			cis := 0
			for p := 0; p < nvml.COMPUTE_INSTANCE_PROFILE_COUNT; p++ {
				ciInfo, ret := gi.GetComputeInstanceProfileInfo(p, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
				if ret == nvml.SUCCESS {
					got, _ := gi.GetComputeInstances(&ciInfo)
					cis += len(got)
				}
			}
			out = append(out, fmt.Sprintf("%d@%d/%d", gii.ProfileId, gii.Placement.Start, cis))
		}
	}
	slices.Sort(out)
	return out
}

// discover returns the rig's GPU, failing on any problem.
func (r *rig) discover(t *testing.T) hardware.GPU {
	t.Helper()
	inv, err := r.hw.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if inv.Problems != nil || len(inv.GPUs) != 1 {
		t.Fatalf("discovered %d GPUs, problems %+v", len(inv.GPUs), inv.Problems)
	}
	return inv.GPUs[0]
}

var migModels = []string{"A100-SXM4-40GB", "A100-SXM4-80GB", "GH200-96GB", "H100-SXM5-80GB", "H200-SXM5-141GB"}

// Every placement of every profile can be made on an empty GPU, comes back
// as discovery sees it, and goes again.
func TestCreateEveryPlacement(t *testing.T) {
	caps := nvmlhw.StandardMIGCapMinors()
	for _, model := range migModels {
		m := models()[model]
		for _, p := range m.MIGProfiles {
			for _, start := range p.PlacementStarts {
				t.Run(fmt.Sprintf("%s/%s@%d", model, p.Name, start), func(t *testing.T) {
					r := newRig(t, model, true)
					got, err := r.hw.CreateMIGDevice(context.Background(), r.at(p.ID, start))
					if err != nil {
						t.Fatal(err)
					}
					giID := m.MemorySlices/p.PlacementSize - 1 + start/p.PlacementSize
					giCap, _ := caps.GI(0, giID)
					ciCap, _ := caps.CI(0, giID, 0)
					want := hardware.MIGDevice{
						UUID: got.UUID, Profile: p.Name, GIProfileID: p.GIProfile, ProfileID: p.ID,
						CIProfileID: p.CIProfile, CIEngProfileID: nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
						GIID: giID, CIID: 0, PlacementStart: start, PlacementSize: p.PlacementSize,
						MemoryBytes: p.MemoryMiB << 20, Multiprocessors: p.Multiprocessors, CopyEngines: p.CopyEngines,
						Decoders: p.Decoders, Encoders: p.Encoders, JPEGEngines: p.JPEGEngines, OFAEngines: p.OFAEngines,
						GICapMinor: giCap, CICapMinor: ciCap,
					}
					if got != want || !patterns().migUUID.MatchString(got.UUID) {
						t.Errorf("created\n got %+v\nwant %+v", got, want)
					}
					if found := r.discover(t).MIGDevices; len(found) != 1 || found[0] != got {
						t.Errorf("discovered %+v, want what CreateMIGDevice returned", found)
					}
					if err := r.hw.DestroyMIGDevice(context.Background(), r.at(p.ID, start)); err != nil {
						t.Fatal(err)
					}
					if g := r.discover(t); g.MIGDevices != nil || r.instances(t) != nil {
						t.Errorf("after destroy: MIG devices %+v, instances %v", g.MIGDevices, r.instances(t))
					}
				})
			}
		}
	}
}

// A placement that overlaps a GPU instance, or a profile with no instance
// left, is refused by NVML with INSUFFICIENT_RESOURCES and by
// CreateMIGDevice with ErrPlacementInUse; a start the profile does not
// have is a plain error. Nothing is left behind either way.
func TestOverlappingPlacementsRejected(t *testing.T) {
	type at struct{ profile, start int }
	tests := []struct {
		name     string
		model    string
		existing []at
		create   at
		ret      nvml.Return
	}{
		{"same 1g", "H100-SXM5-80GB", []at{{19, 3}}, at{19, 3}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"1g in a 2g", "H100-SXM5-80GB", []at{{14, 0}}, at{19, 1}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"1g in the 7g", "A100-SXM4-40GB", []at{{0, 0}}, at{19, 6}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"3g over a 4g", "A100-SXM4-80GB", []at{{5, 0}}, at{9, 0}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"1g.20gb over a 3g", "H200-SXM5-141GB", []at{{9, 4}}, at{15, 6}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"7g over a 1g", "H100-SXM5-80GB", []at{{19, 6}}, at{0, 0}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"second +me", "A100-SXM4-40GB", []at{{20, 0}}, at{20, 3}, nvml.ERROR_INSUFFICIENT_RESOURCES},
		{"2g at an odd start", "H100-SXM5-80GB", nil, at{14, 1}, nvml.ERROR_INVALID_ARGUMENT},
		{"1g at the eighth slice", "H100-SXM5-80GB", nil, at{19, 7}, nvml.ERROR_INVALID_ARGUMENT},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.model, true)
			for _, e := range tt.existing {
				if _, err := r.hw.CreateMIGDevice(context.Background(), r.at(e.profile, e.start)); err != nil {
					t.Fatal(err)
				}
			}
			before := r.instances(t)

			// NVML's answer, asked directly.
			dev := r.nv.devices[0]
			prof, _ := dev.profileOf(&nvml.GpuInstanceProfileInfo{Id: uint32(tt.create.profile)})
			info := prof.giInfo()
			_, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(tt.create.start), Size: uint32(prof.PlacementSize)})
			if ret != tt.ret {
				t.Errorf("nvmlDeviceCreateGpuInstanceWithPlacement: got %v, want %v", ret, tt.ret)
			}

			p := r.at(tt.create.profile, tt.create.start)
			_, err := r.hw.CreateMIGDevice(context.Background(), p)
			inUse := tt.ret == nvml.ERROR_INSUFFICIENT_RESOURCES
			if err == nil || errors.Is(err, hardware.ErrPlacementInUse) != inUse || !strings.Contains(err.Error(), p.String()) {
				t.Errorf("CreateMIGDevice: got %v, want an error naming %s (ErrPlacementInUse: %v)", err, p, inUse)
			}
			if inUse && !errors.Is(err, nvml.ERROR_INSUFFICIENT_RESOURCES) {
				t.Errorf("CreateMIGDevice: %v does not wrap NVML's error", err)
			}
			if after := r.instances(t); !slices.Equal(after, before) {
				t.Errorf("instances changed from %v to %v", before, after)
			}
		})
	}
}

// With MIG mode off NVML refuses GPU instances as not supported; the
// manager says why first.
func TestCreateWithMIGOff(t *testing.T) {
	r := newRig(t, "H100-SXM5-80GB", false)
	info := models()["H100-SXM5-80GB"].MIGProfiles[0].giInfo()
	if _, ret := r.nv.devices[0].CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: 0, Size: 1}); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("nvmlDeviceCreateGpuInstanceWithPlacement: got %v, want ERROR_NOT_SUPPORTED", ret)
	}
	_, err := r.hw.CreateMIGDevice(context.Background(), r.at(19, 0))
	if err == nil || !strings.Contains(err.Error(), "MIG mode of the GPU is off") {
		t.Errorf("got %v", err)
	}
	on := newRig(t, "H100-SXM5-80GB", true)
	for _, tt := range []struct {
		p    hardware.MIGPlacement
		want string
	}{
		{hardware.MIGPlacement{ParentUUID: "GPU-00000000-0000-4000-8000-000000000000", ProfileID: 19},
			"nvmlDeviceGetHandleByUUID: " + nvml.ERROR_NOT_FOUND.Error()},
		{on.at(42, 0), "no GPU instance profile with ID 42 (profile IDs: 19, 14, 9, 5, 0, 20, 15)"},
	} {
		if _, err := on.hw.CreateMIGDevice(context.Background(), tt.p); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("CreateMIGDevice(%s): got %v, want an error saying %q", tt.p, err, tt.want)
		}
	}
}

// Layouts that fill a GPU can be made, and then nothing more fits.
func TestFillLayouts(t *testing.T) {
	type at struct{ profile, start int }
	tests := []struct {
		name   string
		model  string
		layout []at
	}{
		{"7x1g", "H100-SXM5-80GB", []at{{19, 0}, {19, 1}, {19, 2}, {19, 3}, {19, 4}, {19, 5}, {19, 6}}},
		{"4g+3g", "A100-SXM4-40GB", []at{{5, 0}, {9, 4}}},
		{"3x2g+1g", "H200-SXM5-141GB", []at{{14, 0}, {14, 2}, {14, 4}, {19, 6}}},
		{"4x1g.20gb", "A100-SXM4-80GB", []at{{15, 0}, {15, 2}, {15, 4}, {15, 6}}},
		{"2x3g", "H100-SXM5-80GB", []at{{9, 0}, {9, 4}}},
		{"+me, 1g, 2g, 3g", "H100-SXM5-80GB", []at{{20, 0}, {19, 1}, {14, 2}, {9, 4}}},
		{"7g", "H200-SXM5-141GB", []at{{0, 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newRig(t, tt.model, true)
			var want []string
			for _, a := range tt.layout {
				if _, err := r.hw.CreateMIGDevice(context.Background(), r.at(a.profile, a.start)); err != nil {
					t.Fatal(err)
				}
				want = append(want, fmt.Sprintf("%d@%d/1", a.profile, a.start))
			}
			slices.Sort(want)
			if got := r.instances(t); !slices.Equal(got, want) {
				t.Errorf("instances %v, want %v", got, want)
			}
			if got := len(r.discover(t).MIGDevices); got != len(tt.layout) {
				t.Errorf("discovered %d MIG devices, want %d", got, len(tt.layout))
			}
			dev := r.nv.devices[0]
			for _, p := range models()[tt.model].MIGProfiles {
				info := p.giInfo()
				if n, ret := dev.GetGpuInstanceRemainingCapacity(&info); ret != nvml.SUCCESS || n != 0 {
					t.Errorf("remaining capacity of %s: %d, %v; want 0", p.Name, n, ret)
				}
				for _, start := range p.PlacementStarts {
					if _, err := r.hw.CreateMIGDevice(context.Background(), r.at(p.ID, start)); !errors.Is(err, hardware.ErrPlacementInUse) {
						t.Errorf("one more %s at %d: got %v, want ErrPlacementInUse", p.Name, start, err)
					}
				}
			}
			if got := r.instances(t); !slices.Equal(got, want) {
				t.Errorf("refused creations changed the instances to %v", got)
			}
		})
	}
}

// What is left of a GPU's capacity shrinks as instances are made.
func TestRemainingCapacity(t *testing.T) {
	r := newRig(t, "H100-SXM5-80GB", true)
	dev := r.nv.devices[0]
	capacity := func(id int) int {
		p, _ := dev.profileOf(&nvml.GpuInstanceProfileInfo{Id: uint32(id)})
		info := p.giInfo()
		n, ret := dev.GetGpuInstanceRemainingCapacity(&info)
		if ret != nvml.SUCCESS {
			t.Fatalf("remaining capacity of %d: %v", id, ret)
		}
		return n
	}
	if got := []int{capacity(19), capacity(15), capacity(14), capacity(9), capacity(0)}; !slices.Equal(got, []int{7, 4, 3, 2, 1}) {
		t.Errorf("empty GPU: %v", got)
	}
	if _, err := r.hw.CreateMIGDevice(context.Background(), r.at(14, 2)); err != nil {
		t.Fatal(err)
	}
	if got := []int{capacity(19), capacity(15), capacity(14), capacity(9), capacity(0)}; !slices.Equal(got, []int{5, 3, 2, 1, 0}) {
		t.Errorf("with a 2g at 2: %v", got)
	}
}

// A MIG device made again at the same place is a new device: a new UUID.
func TestRecreateGetsNewUUID(t *testing.T) {
	r := newRig(t, "A100-SXM4-40GB", true)
	p := r.at(19, 2)
	seen := map[string]bool{}
	for range 3 {
		mig, err := r.hw.CreateMIGDevice(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		if seen[mig.UUID] || mig.GIID != 9 {
			t.Errorf("re-created %+v: UUID seen before or GI moved", mig)
		}
		seen[mig.UUID] = true
		if err := r.hw.DestroyMIGDevice(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	// The fleet's own MIG devices keep theirs, and a re-made one differs.
	f, err := loadFleet("dgx-a100-mig")
	if err != nil {
		t.Fatal(err)
	}
	n := &f.Nodes[0]
	hw := n.Hardware().(*nvmlhw.Discoverer)
	q := hardware.MIGPlacement{ParentUUID: n.GPUs[0].UUID, ProfileID: 19, Start: 0}
	if err := hw.DestroyMIGDevice(context.Background(), q); err != nil {
		t.Fatal(err)
	}
	mig, err := hw.CreateMIGDevice(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	if mig.UUID == n.GPUs[0].MIGDevices[0].UUID {
		t.Errorf("re-created MIG device kept the fleet's UUID %s", mig.UUID)
	}
}

// DestroyMIGDevice is idempotent, and takes every compute instance with
// the GPU instance.
func TestDestroyMIGDevice(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, "H100-SXM5-80GB", true)
	if err := r.hw.DestroyMIGDevice(ctx, r.at(19, 0)); err != nil {
		t.Errorf("nothing there: %v", err)
	}
	if _, err := r.hw.CreateMIGDevice(ctx, r.at(19, 0)); err != nil {
		t.Fatal(err)
	}
	// Another profile at that start is not the device.
	if err := r.hw.DestroyMIGDevice(ctx, r.at(20, 0)); err != nil || len(r.instances(t)) != 1 {
		t.Errorf("+me at 0: %v, instances %v", err, r.instances(t))
	}
	for range 2 {
		if err := r.hw.DestroyMIGDevice(ctx, r.at(19, 0)); err != nil || r.instances(t) != nil {
			t.Errorf("destroy: %v, instances %v", err, r.instances(t))
		}
	}
	if err := r.hw.DestroyMIGDevice(ctx, r.at(42, 0)); err == nil || !strings.Contains(err.Error(), "no GPU instance profile with ID 42") {
		t.Errorf("unknown profile: got %v", err)
	}
	if off := newRig(t, "H100-SXM5-80GB", false); off.hw.DestroyMIGDevice(ctx, off.at(19, 0)) != nil {
		t.Error("MIG mode off: got an error, want nil")
	}

	// A GPU instance split into compute instances (which discovery
	// reports as problems) goes as a whole.
	f, err := parseFleet([]byte(`
nodes:
- name: split
  gpus:
  - model: H100-SXM5-80GB
    migEnabled: true
    migDevices:
    - {profile: 3g.40gb, placementStart: 4, computeSlices: 1}
`), "split")
	if err != nil {
		t.Fatal(err)
	}
	hw := f.Nodes[0].Hardware()
	if err := hw.(hardware.MIGManager).DestroyMIGDevice(ctx, hardware.MIGPlacement{ParentUUID: f.Nodes[0].GPUs[0].UUID, ProfileID: 9, Start: 4}); err != nil {
		t.Fatal(err)
	}
	if inv, err := hw.Discover(ctx); err != nil || inv.Problems != nil || inv.GPUs[0].MIGDevices != nil {
		t.Errorf("after destroying the split instance: %v, %+v", err, inv)
	}
}

// Concurrent creations, destructions and discoveries on one GPU leave the
// state consistent (run with -race).
func TestConcurrentMIGOperations(t *testing.T) {
	r := newRig(t, "H100-SXM5-80GB", true)
	ctx := context.Background()
	var wg sync.WaitGroup
	for start := range 7 {
		wg.Go(func() {
			if _, err := r.hw.CreateMIGDevice(ctx, r.at(19, start)); err != nil {
				t.Error(err)
			}
			if start%2 == 0 {
				if err := r.hw.DestroyMIGDevice(ctx, r.at(19, start)); err != nil {
					t.Error(err)
				}
			}
		})
		wg.Go(func() {
			if _, err := r.hw.Discover(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	var starts []int
	for _, m := range r.discover(t).MIGDevices {
		starts = append(starts, m.PlacementStart)
	}
	if !slices.Equal(starts, []int{1, 3, 5}) {
		t.Errorf("MIG devices at %v, want 1, 3, 5", starts)
	}
}
