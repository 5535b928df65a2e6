package nvmlhw_test

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/nvmlhw"
)

// The H100 GPU instance profiles the MIG mock offers, as `nvidia-smi mig
// -lgip` shows them, with their placement sizes.
var (
	mockGIProfiles = map[int]nvml.GpuInstanceProfileInfo{
		nvml.GPU_INSTANCE_PROFILE_1_SLICE: {Id: 19, SliceCount: 1, InstanceCount: 7, MultiprocessorCount: 16,
			CopyEngineCount: 1, DecoderCount: 1, JpegCount: 1, MemorySizeMB: 9984},
		nvml.GPU_INSTANCE_PROFILE_2_SLICE: {Id: 14, SliceCount: 2, InstanceCount: 3, MultiprocessorCount: 32,
			CopyEngineCount: 2, DecoderCount: 2, JpegCount: 2, MemorySizeMB: 20096},
		nvml.GPU_INSTANCE_PROFILE_7_SLICE: {Id: 0, SliceCount: 7, InstanceCount: 1, MultiprocessorCount: 132,
			CopyEngineCount: 8, DecoderCount: 7, JpegCount: 7, OfaCount: 1, MemorySizeMB: 81152},
	}
	mockPlacementSize = map[int]uint32{
		nvml.GPU_INSTANCE_PROFILE_1_SLICE: 1,
		nvml.GPU_INSTANCE_PROFILE_2_SLICE: 2,
		nvml.GPU_INSTANCE_PROFILE_7_SLICE: 8,
	}
	// mockPlacementStarts are the profiles' possible placements as
	// `nvidia-smi mig -lgipp` lists them, in an order of NVML's choosing.
	mockPlacementStarts = map[int][]uint32{
		nvml.GPU_INSTANCE_PROFILE_1_SLICE: {6, 5, 4, 3, 2, 1, 0},
		nvml.GPU_INSTANCE_PROFILE_2_SLICE: {0, 2, 4},
		nvml.GPU_INSTANCE_PROFILE_7_SLICE: {0},
	}
	// mockCIProfiles maps compute slices to NVML_COMPUTE_INSTANCE_PROFILE_*,
	// which is also the profile's ID.
	mockCIProfiles = map[uint32]int{
		1: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE,
		2: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
		7: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
	}
)

// migSpec is one MIG device of the mock: a compute instance in a GPU
// instance.
type migSpec struct {
	giProfile int // NVML_GPU_INSTANCE_PROFILE_*
	giID      int
	start     uint32
	ciID      int
	ciSlices  uint32 // 0: spans the GPU instance
}

// mockMIG is the handle, GPU instance and compute instance of one MIG
// device, so that single calls can be broken.
type mockMIG struct {
	dev *mock.Device
	gi  *mock.GpuInstance
	ci  *mock.ComputeInstance
}

// migMock is an H100 (minor 3) in MIG mode holding MIG devices MIG-0,
// MIG-1, ... built from moq types.
type migMock struct {
	gpu  *mock.Device
	migs []*mockMIG
}

func newMIGMock(specs ...migSpec) *migMock {
	m := &migMock{gpu: newMockGPU(0)}
	gis := map[int]*mock.GpuInstance{}
	cis := map[int]map[int]*mock.ComputeInstance{}
	for k, s := range specs {
		prof := mockGIProfiles[s.giProfile]
		slices := s.ciSlices
		if slices == 0 {
			slices = prof.SliceCount
		}
		gi := gis[s.giID]
		if gi == nil {
			gi = &mock.GpuInstance{
				GetInfoFunc: func() (nvml.GpuInstanceInfo, nvml.Return) {
					return nvml.GpuInstanceInfo{Id: uint32(s.giID), ProfileId: prof.Id,
						Placement: nvml.GpuInstancePlacement{Start: s.start, Size: mockPlacementSize[s.giProfile]}}, nvml.SUCCESS
				},
				GetComputeInstanceByIdFunc: func(id int) (nvml.ComputeInstance, nvml.Return) {
					if ci := cis[s.giID][id]; ci != nil {
						return ci, nvml.SUCCESS
					}
					return nil, nvml.ERROR_NOT_FOUND
				},
				GetComputeInstanceProfileInfoFunc: func(p, e int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
					for c, idx := range mockCIProfiles {
						if idx == p && e == nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED && c <= prof.SliceCount {
							return nvml.ComputeInstanceProfileInfo{Id: uint32(idx), SliceCount: c}, nvml.SUCCESS
						}
					}
					return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
				},
			}
			gis[s.giID] = gi
			cis[s.giID] = map[int]*mock.ComputeInstance{}
		}
		ci := &mock.ComputeInstance{GetInfoFunc: func() (nvml.ComputeInstanceInfo, nvml.Return) {
			return nvml.ComputeInstanceInfo{Id: uint32(s.ciID), ProfileId: uint32(mockCIProfiles[slices])}, nvml.SUCCESS
		}}
		cis[s.giID][s.ciID] = ci
		dev := &mock.Device{
			GetUUIDFunc:              func() (string, nvml.Return) { return fmt.Sprintf("MIG-%d", k), nvml.SUCCESS },
			GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return s.giID, nvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, nvml.Return) { return s.ciID, nvml.SUCCESS },
		}
		m.migs = append(m.migs, &mockMIG{dev: dev, gi: gi, ci: ci})
	}

	m.gpu.GetMinorNumberFunc = func() (int, nvml.Return) { return 3, nvml.SUCCESS }
	m.gpu.GetMigModeFunc = func() (int, int, nvml.Return) {
		return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS
	}
	m.gpu.GetGpuInstanceProfileInfoFunc = func(p int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		if info, ok := mockGIProfiles[p]; ok {
			return info, nvml.SUCCESS
		}
		if p < 0 || p >= nvml.GPU_INSTANCE_PROFILE_COUNT {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	m.gpu.GetGpuInstancePossiblePlacementsFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
		for p, prof := range mockGIProfiles {
			if prof.Id != info.Id {
				continue
			}
			var out []nvml.GpuInstancePlacement
			for _, s := range mockPlacementStarts[p] {
				out = append(out, nvml.GpuInstancePlacement{Start: s, Size: mockPlacementSize[p]})
			}
			return out, nvml.SUCCESS
		}
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	m.gpu.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	m.gpu.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i < len(m.migs) {
			return m.migs[i].dev, nvml.SUCCESS
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	m.gpu.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		if gi := gis[id]; gi != nil {
			return gi, nvml.SUCCESS
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	return m
}

// Specs of the MIG devices the tests use; GPU instance IDs as the driver
// numbers them (the 7-slice instance is GI 0, 1-slice ones at start s GI
// 7+s, the 2-slice one at 0 GI 3).
var (
	mig7g    = migSpec{giProfile: nvml.GPU_INSTANCE_PROFILE_7_SLICE, giID: 0}
	mig1gAt0 = migSpec{giProfile: nvml.GPU_INSTANCE_PROFILE_1_SLICE, giID: 7, start: 0}
	mig1gAt1 = migSpec{giProfile: nvml.GPU_INSTANCE_PROFILE_1_SLICE, giID: 8, start: 1}
	mig1gAt2 = migSpec{giProfile: nvml.GPU_INSTANCE_PROFILE_1_SLICE, giID: 9, start: 2}
	mig1c2gA = migSpec{giProfile: nvml.GPU_INSTANCE_PROFILE_2_SLICE, giID: 3, start: 0, ciID: 0, ciSlices: 1}
	mig1c2gB = migSpec{giProfile: nvml.GPU_INSTANCE_PROFILE_2_SLICE, giID: 3, start: 0, ciID: 1, ciSlices: 1}
	standard = staticSystem{caps: nvmlhw.StandardMIGCapMinors()}
)

func migUUIDs(migs []hardware.MIGDevice) []string {
	var uuids []string
	for _, m := range migs {
		uuids = append(uuids, m.UUID)
	}
	return uuids
}

func TestDiscoverMIGMock(t *testing.T) {
	inv, err := newMockLib(newMIGMock(mig7g).gpu).discover(standard)
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) != 1 || inv.Problems != nil {
		t.Fatalf("got GPUs %+v, problems %+v", inv.GPUs, inv.Problems)
	}
	g := inv.GPUs[0]
	if !g.MIGCapable || !g.MIGEnabled || len(g.MIGDevices) != 1 || g.MemoryBytes != 81559<<20 {
		t.Fatalf("got %+v", g)
	}
	want := hardware.MIGDevice{
		UUID: "MIG-0", Profile: "7g.80gb", GIProfileID: nvml.GPU_INSTANCE_PROFILE_7_SLICE, ProfileID: 0,
		CIProfileID: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE, PlacementSize: 8, MemoryBytes: 81152 << 20,
		Multiprocessors: 132, CopyEngines: 8, Decoders: 7, JPEGEngines: 7, OFAEngines: 1,
		// gpu3/gi0/access and gpu3/gi0/ci0/access
		GICapMinor: 3 + 3*135, CICapMinor: 3 + 3*135 + 1,
	}
	if g.MIGDevices[0] != want {
		t.Errorf("got  %+v\nwant %+v", g.MIGDevices[0], want)
	}
	if !reflect.DeepEqual(g.MIGProfiles, mockMIGProfiles) || g.MIGMemorySlices != 8 {
		t.Errorf("MIG profiles, %d memory slices:\n got %+v\nwant %+v", g.MIGMemorySlices, g.MIGProfiles, mockMIGProfiles)
	}
}

// mockMIGProfiles are the profiles discovery reports for the mock GPU, in
// NVML profile index order, with sorted placement starts.
var mockMIGProfiles = []hardware.MIGProfile{
	{Name: "1g.10gb", GIProfileID: nvml.GPU_INSTANCE_PROFILE_1_SLICE, ProfileID: 19, CIProfileID: nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE,
		Slices: 1, Instances: 7, MemoryBytes: 9984 << 20, Multiprocessors: 16, CopyEngines: 1, Decoders: 1, JPEGEngines: 1,
		PlacementSize: 1, PlacementStarts: []int{0, 1, 2, 3, 4, 5, 6}},
	{Name: "2g.20gb", GIProfileID: nvml.GPU_INSTANCE_PROFILE_2_SLICE, ProfileID: 14, CIProfileID: nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE,
		Slices: 2, Instances: 3, MemoryBytes: 20096 << 20, Multiprocessors: 32, CopyEngines: 2, Decoders: 2, JPEGEngines: 2,
		PlacementSize: 2, PlacementStarts: []int{0, 2, 4}},
	{Name: "7g.80gb", GIProfileID: nvml.GPU_INSTANCE_PROFILE_7_SLICE, ProfileID: 0, CIProfileID: nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE,
		Slices: 7, Instances: 1, MemoryBytes: 81152 << 20, Multiprocessors: 132, CopyEngines: 8, Decoders: 7, JPEGEngines: 7, OFAEngines: 1,
		PlacementSize: 8, PlacementStarts: []int{0}},
}

// NVML answers the profile queries with MIG mode off, so a GPU that could
// be switched to MIG carries its profiles; its MIG devices are not listed.
func TestDiscoverMIGProfilesWithMIGOff(t *testing.T) {
	m := newMIGMock()
	m.gpu.GetMigModeFunc = func() (int, int, nvml.Return) {
		return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE, nvml.SUCCESS
	}
	m.gpu.GetMaxMigDeviceCountFunc = nil // the moq type panics if it is called
	inv, err := newMockLib(m.gpu).discover(standard)
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) != 1 || inv.Problems != nil {
		t.Fatalf("got GPUs %+v, problems %+v", inv.GPUs, inv.Problems)
	}
	g := inv.GPUs[0]
	if !g.MIGCapable || g.MIGEnabled || g.MIGDevices != nil {
		t.Errorf("got %+v, want MIG capable, off, without MIG devices", g)
	}
	if !reflect.DeepEqual(g.MIGProfiles, mockMIGProfiles) || g.MIGMemorySlices != 8 {
		t.Errorf("MIG profiles, %d memory slices:\n got %+v\nwant %+v", g.MIGMemorySlices, g.MIGProfiles, mockMIGProfiles)
	}
}

// An unprivileged caller learns no placements, nor, in MIG mode, the GPU's
// memory that profile names derive from: the GPU is published without
// profiles.
func TestDiscoverMIGProfilesUnprivileged(t *testing.T) {
	tests := []struct {
		name    string
		breakIt func(m *migMock)
	}{
		{"placements", func(m *migMock) {
			m.gpu.GetGpuInstancePossiblePlacementsFunc = func(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
				return nil, nvml.ERROR_NO_PERMISSION
			}
		}},
		{"memory", func(m *migMock) {
			m.gpu.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_NO_PERMISSION }
			m.gpu.GetGpuInstancePossiblePlacementsFunc = nil // the moq type panics if it is called
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMIGMock()
			tt.breakIt(m)
			inv, err := newMockLib(m.gpu).discover(standard)
			if err != nil {
				t.Fatal(err)
			}
			if len(inv.GPUs) != 1 || inv.Problems != nil {
				t.Fatalf("got GPUs %+v, problems %+v", inv.GPUs, inv.Problems)
			}
			// Expected of unprivileged callers, so not reported as unread.
			if g := inv.GPUs[0]; !g.MIGEnabled || g.MIGProfiles != nil || g.MIGMemorySlices != 0 || g.Unread != nil {
				t.Errorf("got %+v, want a MIG-enabled GPU without profiles, nothing unread", g)
			}
		})
	}
}

// Profiles that NVML describes oddly are not published, rather than
// offer MIG devices that cannot be made; the GPU and its MIG devices are.
func TestDiscoverMIGProfileErrors(t *testing.T) {
	tests := []struct {
		name    string
		breakIt func(m *migMock)
		query   string
		want    string
	}{
		{"mixed placement sizes", func(m *migMock) {
			m.gpu.GetGpuInstancePossiblePlacementsFunc = func(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
				return []nvml.GpuInstancePlacement{{Start: 0, Size: 1}, {Start: 2, Size: 2}}, nvml.SUCCESS
			}
		}, "nvmlDeviceGetGpuInstancePossiblePlacements(profile 19)", "GPU instance profile 19 has placements of sizes 1 and 2"},
		{"no spanning compute instance", func(m *migMock) {
			get := m.gpu.GetGpuInstanceProfileInfoFunc
			m.gpu.GetGpuInstanceProfileInfoFunc = func(p int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
				info, ret := get(p)
				if p == nvml.GPU_INSTANCE_PROFILE_2_SLICE {
					info.SliceCount = 5
				}
				return info, ret
			}
		}, "nvmlDeviceGetGpuInstanceProfileInfo(1)", "GPU instance profile 14 has 5 compute slices, which no compute instance profile spans"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMIGMock(mig1gAt0)
			tt.breakIt(m)
			inv, err := newMockLib(m.gpu, newMockGPU(1)).discover(standard)
			if err != nil {
				t.Fatal(err)
			}
			if got := gpuUUIDs(inv); !reflect.DeepEqual(got, []string{"GPU-0", "GPU-1"}) || inv.Problems != nil {
				t.Fatalf("discovered %v, problems %+v; want both GPUs, no problem", got, inv.Problems)
			}
			g := inv.GPUs[0]
			if g.MIGProfiles != nil || g.MIGMemorySlices != 0 || !reflect.DeepEqual(migUUIDs(g.MIGDevices), []string{"MIG-0"}) {
				t.Errorf("GPU 0: profiles %+v, %d memory slices, MIG devices %v; want no profile and MIG-0", g.MIGProfiles, g.MIGMemorySlices, migUUIDs(g.MIGDevices))
			}
			want := []hardware.Unread{{Property: hardware.PropertyMIGProfiles, Query: tt.query, Err: tt.want}}
			if !reflect.DeepEqual(g.Unread, want) {
				t.Errorf("unread %+v, want %+v", g.Unread, want)
			}
		})
	}
}

// A MIG device that cannot be read, or that gpudra does not model, is left
// out and reported; its GPU and the GPU's other MIG devices stay.
func TestDiscoverMIGDeviceProblems(t *testing.T) {
	fail := nvml.ERROR_UNKNOWN
	tests := []struct {
		name    string
		specs   []migSpec
		breakIt func(m *migMock, sys *staticSystem)
		// published and reported are MIG device UUIDs.
		published, reported []string
		want                string
	}{
		{"GI by ID", []migSpec{mig1gAt0, mig1gAt1}, func(m *migMock, _ *staticSystem) {
			m.gpu.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
				if id == 7 {
					return nil, fail
				}
				return m.migs[1].gi, nvml.SUCCESS
			}
		}, []string{"MIG-1"}, []string{"MIG-0"}, "nvmlDeviceGetGpuInstanceById(7): " + fail.Error()},
		{"CI info", []migSpec{mig1gAt0, mig1gAt1}, func(m *migMock, _ *staticSystem) {
			m.migs[0].ci.GetInfoFunc = func() (nvml.ComputeInstanceInfo, nvml.Return) { return nvml.ComputeInstanceInfo{}, fail }
		}, []string{"MIG-1"}, []string{"MIG-0"}, "nvmlComputeInstanceGetInfo(GI 7, CI 0): " + fail.Error()},
		{"unknown GI profile", []migSpec{mig1gAt0, mig1gAt1}, func(m *migMock, _ *staticSystem) {
			m.migs[1].gi.GetInfoFunc = func() (nvml.GpuInstanceInfo, nvml.Return) {
				return nvml.GpuInstanceInfo{Id: 8, ProfileId: 42}, nvml.SUCCESS
			}
		}, []string{"MIG-0"}, []string{"MIG-1"}, "GI 8 has profile ID 42, which the GPU does not list"},
		{"unknown CI profile", []migSpec{mig1gAt0, mig1gAt1}, func(m *migMock, _ *staticSystem) {
			m.migs[0].ci.GetInfoFunc = func() (nvml.ComputeInstanceInfo, nvml.Return) {
				return nvml.ComputeInstanceInfo{ProfileId: 9}, nvml.SUCCESS
			}
		}, []string{"MIG-1"}, []string{"MIG-0"}, "no compute instance profile has ID 9"},
		{"caps unreadable", []migSpec{mig1gAt0, mig1gAt1}, func(_ *migMock, sys *staticSystem) {
			sys.capsErr = errors.New("read MIG capability minors: no such file")
		}, nil, []string{"MIG-0", "MIG-1"}, "read MIG capability minors: no such file"},
		{"caps incomplete", []migSpec{mig1gAt0, mig1gAt1}, func(_ *migMock, sys *staticSystem) {
			sys.caps = nvmlhw.MIGCapMinors{"gpu3/gi7/access": 411, "gpu3/gi8/access": 420, "gpu3/gi8/ci0/access": 421}
		}, []string{"MIG-1"}, []string{"MIG-0"}, "no entry gpu3/gi7/ci0/access"},
		// Two 1c.2g.20gb compute instances in one 2g.20gb GPU instance
		// would both be named for the GPU instance.
		{"partial compute instances", []migSpec{mig1c2gA, mig1c2gB, mig1gAt2}, func(*migMock, *staticSystem) {},
			[]string{"MIG-2"}, []string{"MIG-0", "MIG-1"}, "partial compute instances are not supported: CI "},
		// Unprivileged callers get no memory figure for a GPU in MIG mode;
		// the GPU stays, but its profile names cannot be derived.
		{"parent memory", []migSpec{mig1gAt0, mig1gAt1}, func(m *migMock, _ *staticSystem) {
			m.gpu.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_NO_PERMISSION }
		}, nil, []string{"MIG-0", "MIG-1"},
			"MIG profile name: the GPU's total memory is unknown: nvmlDeviceGetMemoryInfo: " + nvml.ERROR_NO_PERMISSION.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMIGMock(tt.specs...)
			sys := standard
			tt.breakIt(m, &sys)
			inv, err := newMockLib(m.gpu, newMockGPU(1)).discover(sys)
			if err != nil {
				t.Fatal(err)
			}
			if got := gpuUUIDs(inv); !reflect.DeepEqual(got, []string{"GPU-0", "GPU-1"}) {
				t.Fatalf("discovered GPUs %v, want GPU-0 and GPU-1", got)
			}
			g := inv.GPUs[0]
			if !g.MIGEnabled {
				t.Errorf("GPU-0 lost its MIG mode: %+v", g)
			}
			if got := migUUIDs(g.MIGDevices); !reflect.DeepEqual(got, tt.published) {
				t.Errorf("published MIG devices %v, want %v", got, tt.published)
			}
			var reported []string
			for _, p := range inv.Problems {
				reported = append(reported, p.MIGDevice)
				prefix := fmt.Sprintf("GPU 0 (GPU-0): MIG device %s: ", p.MIGDevice)
				if p.Index != 0 || p.UUID != "GPU-0" || !strings.HasPrefix(p.Err, prefix) || !strings.Contains(p.Err, tt.want) {
					t.Errorf("problem %+v, want GPU 0's and an error %q...%q", p, prefix, tt.want)
				}
			}
			if !reflect.DeepEqual(reported, tt.reported) {
				t.Errorf("reported MIG devices %v, want %v", reported, tt.reported)
			}
		})
	}
}

// A GPU whose MIG devices cannot be listed is published without them, and
// without MIG profiles: a placement could collide with the devices it
// cannot see. Profiles that cannot be read leave the MIG devices, which
// are told apart by them, unread too.
func TestDiscoverMIGListErrors(t *testing.T) {
	fail := nvml.ERROR_UNKNOWN
	profiles, devices := hardware.PropertyMIGProfiles, hardware.PropertyMIGDevices
	tests := []struct {
		name    string
		breakIt func(m *migMock)
		// unread are the properties and queries; published the MIG
		// devices still published.
		unread    []hardware.Unread
		published []string
	}{
		{"profile info", func(m *migMock) {
			m.gpu.GetGpuInstanceProfileInfoFunc = func(int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
				return nvml.GpuInstanceProfileInfo{}, fail
			}
		}, []hardware.Unread{
			{Property: profiles, Query: "nvmlDeviceGetGpuInstanceProfileInfo(0)"},
			{Property: devices, Query: "nvmlDeviceGetGpuInstanceProfileInfo(0)"},
		}, nil},
		{"placements", func(m *migMock) {
			m.gpu.GetGpuInstancePossiblePlacementsFunc = func(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
				return nil, fail
			}
		}, []hardware.Unread{{Property: profiles, Query: "nvmlDeviceGetGpuInstancePossiblePlacements(profile 19)"}}, []string{"MIG-0", "MIG-1"}},
		{"max count", func(m *migMock) {
			m.gpu.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 0, fail }
		}, []hardware.Unread{{Property: devices, Query: "nvmlDeviceGetMaxMigDeviceCount"}}, nil},
		{"handle", func(m *migMock) {
			m.gpu.GetMigDeviceHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, fail }
		}, []hardware.Unread{{Property: devices, Query: "nvmlDeviceGetMigDeviceHandleByIndex(0)"}}, nil},
		{"MIG UUID", func(m *migMock) {
			m.migs[1].dev.GetUUIDFunc = func() (string, nvml.Return) { return "", fail }
		}, []hardware.Unread{{Property: devices, Query: "nvmlDeviceGetUUID(MIG device 1)"}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMIGMock(mig1gAt0, mig1gAt1)
			tt.breakIt(m)
			inv, err := newMockLib(m.gpu, newMockGPU(1)).discover(standard)
			if err != nil {
				t.Fatal(err)
			}
			if got := gpuUUIDs(inv); !reflect.DeepEqual(got, []string{"GPU-0", "GPU-1"}) || inv.Problems != nil {
				t.Fatalf("discovered %v, problems %+v; want both GPUs, no problem", got, inv.Problems)
			}
			g := inv.GPUs[0]
			if !g.MIGEnabled || g.MIGProfiles != nil || g.MIGMemorySlices != 0 || !reflect.DeepEqual(migUUIDs(g.MIGDevices), tt.published) {
				t.Errorf("GPU 0: MIG on %v, profiles %+v, %d memory slices, MIG devices %v; want MIG on, no profile, MIG devices %v",
					g.MIGEnabled, g.MIGProfiles, g.MIGMemorySlices, migUUIDs(g.MIGDevices), tt.published)
			}
			for i := range tt.unread {
				tt.unread[i].Err = fail.Error()
			}
			if !reflect.DeepEqual(g.Unread, tt.unread) {
				t.Errorf("unread %+v, want %+v", g.Unread, tt.unread)
			}
		})
	}
}
