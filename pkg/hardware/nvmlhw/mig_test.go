package nvmlhw_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/nvmlhw"
)

// migMock is an H100 (minor 3) in MIG mode holding one 7g.80gb device,
// built from moq types so that single calls can be broken.
type migMock struct {
	gpu *mock.Device
	mig *mock.Device
	gi  *mock.GpuInstance
	ci  *mock.ComputeInstance
}

func newMIGMock() *migMock {
	m := &migMock{gpu: newMockGPU(0), mig: &mock.Device{}, gi: &mock.GpuInstance{}, ci: &mock.ComputeInstance{}}
	m.gpu.GetMinorNumberFunc = func() (int, nvml.Return) { return 3, nvml.SUCCESS }
	m.gpu.GetMigModeFunc = func() (int, int, nvml.Return) {
		return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS
	}
	m.gpu.GetGpuInstanceProfileInfoFunc = func(p int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		switch p {
		case nvml.GPU_INSTANCE_PROFILE_7_SLICE:
			return nvml.GpuInstanceProfileInfo{Id: 0, SliceCount: 7, InstanceCount: 1, MultiprocessorCount: 132,
				CopyEngineCount: 8, DecoderCount: 7, JpegCount: 7, OfaCount: 1, MemorySizeMB: 81152}, nvml.SUCCESS
		case nvml.GPU_INSTANCE_PROFILE_1_SLICE:
			return nvml.GpuInstanceProfileInfo{Id: 19, SliceCount: 1, InstanceCount: 7, MemorySizeMB: 9984}, nvml.SUCCESS
		case nvml.GPU_INSTANCE_PROFILE_COUNT:
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	m.gpu.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	m.gpu.GetMigDeviceHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
		if i == 0 {
			return m.mig, nvml.SUCCESS
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	m.gpu.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		if id == 0 {
			return m.gi, nvml.SUCCESS
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
	m.mig.GetUUIDFunc = func() (string, nvml.Return) { return "MIG-0", nvml.SUCCESS }
	m.mig.GetGpuInstanceIdFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
	m.mig.GetComputeInstanceIdFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
	m.gi.GetInfoFunc = func() (nvml.GpuInstanceInfo, nvml.Return) {
		return nvml.GpuInstanceInfo{Id: 0, ProfileId: 0, Placement: nvml.GpuInstancePlacement{Start: 0, Size: 8}}, nvml.SUCCESS
	}
	m.gi.GetComputeInstanceByIdFunc = func(id int) (nvml.ComputeInstance, nvml.Return) { return m.ci, nvml.SUCCESS }
	m.gi.GetComputeInstanceProfileInfoFunc = func(p, e int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
		if p == nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE && e == nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
			return nvml.ComputeInstanceProfileInfo{Id: 4, SliceCount: 7}, nvml.SUCCESS
		}
		return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	m.ci.GetInfoFunc = func() (nvml.ComputeInstanceInfo, nvml.Return) {
		return nvml.ComputeInstanceInfo{Id: 0, ProfileId: 4}, nvml.SUCCESS
	}
	return m
}

func TestDiscoverMIGMock(t *testing.T) {
	inv, err := newMockLib(newMIGMock().gpu).discover(staticSystem{caps: nvmlhw.StandardMIGCapMinors()})
	if err != nil {
		t.Fatal(err)
	}
	g := inv.GPUs[0]
	if !g.MIGCapable || !g.MIGEnabled || len(g.MIGDevices) != 1 {
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
}

func TestDiscoverMIGErrors(t *testing.T) {
	fail := nvml.ERROR_UNKNOWN
	tests := []struct {
		name    string
		breakIt func(m *migMock, sys *staticSystem)
		want    string
	}{
		{"profile info", func(m *migMock, _ *staticSystem) {
			m.gpu.GetGpuInstanceProfileInfoFunc = func(int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
				return nvml.GpuInstanceProfileInfo{}, fail
			}
		}, "nvmlDeviceGetGpuInstanceProfileInfo(0)"},
		{"max count", func(m *migMock, _ *staticSystem) {
			m.gpu.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 0, fail }
		}, "nvmlDeviceGetMaxMigDeviceCount"},
		{"handle", func(m *migMock, _ *staticSystem) {
			m.gpu.GetMigDeviceHandleByIndexFunc = func(int) (nvml.Device, nvml.Return) { return nil, fail }
		}, "nvmlDeviceGetMigDeviceHandleByIndex(0)"},
		{"MIG UUID", func(m *migMock, _ *staticSystem) {
			m.mig.GetUUIDFunc = func() (string, nvml.Return) { return "", fail }
		}, "MIG device 0: nvmlDeviceGetUUID"},
		{"GI by ID", func(m *migMock, _ *staticSystem) {
			m.gpu.GetGpuInstanceByIdFunc = func(int) (nvml.GpuInstance, nvml.Return) { return nil, fail }
		}, "MIG device 0: MIG-0: nvmlDeviceGetGpuInstanceById(0)"},
		{"CI info", func(m *migMock, _ *staticSystem) {
			m.ci.GetInfoFunc = func() (nvml.ComputeInstanceInfo, nvml.Return) { return nvml.ComputeInstanceInfo{}, fail }
		}, "MIG-0: nvmlComputeInstanceGetInfo(GI 0, CI 0)"},
		{"unknown GI profile", func(m *migMock, _ *staticSystem) {
			m.gi.GetInfoFunc = func() (nvml.GpuInstanceInfo, nvml.Return) {
				return nvml.GpuInstanceInfo{Id: 0, ProfileId: 42}, nvml.SUCCESS
			}
		}, "GI 0 has profile ID 42, which the GPU does not list"},
		{"unknown CI profile", func(m *migMock, _ *staticSystem) {
			m.ci.GetInfoFunc = func() (nvml.ComputeInstanceInfo, nvml.Return) {
				return nvml.ComputeInstanceInfo{ProfileId: 9}, nvml.SUCCESS
			}
		}, "no compute instance profile has ID 9"},
		{"caps unreadable", func(_ *migMock, sys *staticSystem) {
			sys.capsErr = errors.New("read MIG capability minors: no such file")
		}, "read MIG capability minors: no such file"},
		{"caps incomplete", func(_ *migMock, sys *staticSystem) {
			sys.caps = nvmlhw.MIGCapMinors{"gpu3/gi0/access": 408}
		}, "no entry gpu3/gi0/ci0/access"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMIGMock()
			sys := staticSystem{caps: nvmlhw.StandardMIGCapMinors()}
			tt.breakIt(m, &sys)
			_, err := newMockLib(m.gpu).discover(sys)
			if err == nil {
				t.Fatal("got no error")
			}
			if !strings.HasPrefix(err.Error(), "GPU 0 (GPU-0): MIG devices: ") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not name the GPU and %q", err, tt.want)
			}
		})
	}
}
