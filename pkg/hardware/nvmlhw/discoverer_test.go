package nvmlhw_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/nvmlhw"
)

var busIDRE = regexp.MustCompile(`^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)

// staticSystem is a SystemInfo with fixed answers.
type staticSystem struct {
	majorsErr error
	caps      nvmlhw.MIGCapMinors
	capsErr   error
}

func (s staticSystem) Majors() (hardware.Majors, error) {
	return hardware.Majors{NVIDIA: 195, UVM: 509, Caps: 510}, s.majorsErr
}

func (s staticSystem) MIGCapMinors() (nvmlhw.MIGCapMinors, error) { return s.caps, s.capsErr }

// noTopology knows no device, and fails for the bus IDs in broken.
type noTopology struct{ broken string }

func (t noTopology) PCIeRoot(busID string) (string, error) {
	if busID == t.broken {
		return "", errors.New("PCIe root of " + busID + ": permission denied")
	}
	return "", nil
}

func (noTopology) NUMANode(string) (*int, error) { return nil, nil }

// mockLib is a working NVML made of go-nvml's moq types; tests break one
// call at a time.
type mockLib struct {
	lib       *mock.Interface
	devices   []*mock.Device
	topo      noTopology
	shutdowns int
}

func newMockLib(devices ...*mock.Device) *mockLib {
	m := &mockLib{devices: devices}
	m.lib = &mock.Interface{
		InitWithFlagsFunc:              func(uint32) nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:                   func() nvml.Return { m.shutdowns++; return nvml.SUCCESS },
		SystemGetDriverVersionFunc:     func() (string, nvml.Return) { return "580.65.06", nvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, nvml.Return) { return 12080, nvml.SUCCESS },
		DeviceGetCountFunc:             func() (int, nvml.Return) { return len(m.devices), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			return m.devices[i], nvml.SUCCESS
		},
	}
	return m
}

func (m *mockLib) discover(sys nvmlhw.SystemInfo) (*hardware.Inventory, error) {
	return m.hardware(sys).Discover(context.Background())
}

func (m *mockLib) hardware(sys nvmlhw.SystemInfo) *nvmlhw.Discoverer {
	return nvmlhw.NewFromInterface(m.lib, m.topo, sys)
}

// newMockGPU returns an H100 without MIG support at index i.
func newMockGPU(i int) *mock.Device {
	return &mock.Device{
		GetUUIDFunc:        func() (string, nvml.Return) { return fmt.Sprintf("GPU-%d", i), nvml.SUCCESS },
		GetNameFunc:        func() (string, nvml.Return) { return "NVIDIA H100 80GB HBM3", nvml.SUCCESS },
		GetMinorNumberFunc: func() (int, nvml.Return) { return i, nvml.SUCCESS },
		GetBrandFunc:       func() (nvml.BrandType, nvml.Return) { return nvml.BRAND_NVIDIA, nvml.SUCCESS },
		GetArchitectureFunc: func() (nvml.DeviceArchitecture, nvml.Return) {
			return nvml.DEVICE_ARCH_HOPPER, nvml.SUCCESS
		},
		GetCudaComputeCapabilityFunc: func() (int, int, nvml.Return) { return 9, 0, nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: 81559 << 20}, nvml.SUCCESS
		},
		GetPciInfoFunc: func() (nvml.PciInfo, nvml.Return) {
			var info nvml.PciInfo
			for j, c := range fmt.Sprintf("00000000:%02X:00.0", 0x1b+i) {
				info.BusId[j] = int8(c)
			}
			return info, nvml.SUCCESS
		},
		GetMigModeFunc: func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED },
		GetGpuFabricInfoFunc: func() (nvml.GpuFabricInfo, nvml.Return) {
			return nvml.GpuFabricInfo{}, nvml.ERROR_NOT_SUPPORTED
		},
	}
}

func TestDiscoverMock(t *testing.T) {
	m := newMockLib(newMockGPU(0), newMockGPU(1))
	inv, err := m.discover(staticSystem{})
	if err != nil {
		t.Fatal(err)
	}
	if inv.CUDADriverVersion != "12.8" || inv.DriverVersion != "580.65.06" {
		t.Errorf("versions: %q %q", inv.DriverVersion, inv.CUDADriverVersion)
	}
	if len(inv.GPUs) != 2 || inv.Problems != nil {
		t.Fatalf("got GPUs %v, problems %+v; want 2 GPUs, no problems", gpuUUIDs(inv), inv.Problems)
	}
	g := inv.GPUs[1]
	want := hardware.GPU{
		Index: 1, Minor: 1, UUID: "GPU-1", ProductName: "NVIDIA H100 80GB HBM3", Brand: "Nvidia",
		Architecture: "Hopper", CUDAComputeCapability: "9.0", MemoryBytes: 81559 << 20, PCIBusID: "0000:1c:00.0",
	}
	if !reflect.DeepEqual(g, want) {
		t.Errorf("got %+v\nwant %+v", g, want)
	}
	if m.shutdowns != 1 {
		t.Errorf("Shutdown called %d times, want 1", m.shutdowns)
	}
}

func TestDiscoverInitFailure(t *testing.T) {
	tests := []struct {
		ret  nvml.Return
		want string
	}{
		{nvml.ERROR_LIBRARY_NOT_FOUND, "cannot load NVML"},
		{nvml.ERROR_DRIVER_NOT_LOADED, "kernel driver is not loaded"},
		{nvml.ERROR_NO_PERMISSION, "no permission to open /dev/nvidiactl"},
		{nvml.ERROR_LIB_RM_VERSION_MISMATCH, "does not match the version of the loaded kernel driver"},
		{nvml.ERROR_UNKNOWN, "initialize NVML"},
	}
	for _, tt := range tests {
		t.Run(tt.ret.Error(), func(t *testing.T) {
			m := newMockLib(newMockGPU(0))
			m.lib.InitWithFlagsFunc = func(uint32) nvml.Return { return tt.ret }
			_, err := m.discover(staticSystem{})
			if !errors.Is(err, hardware.ErrUnavailable) || !errors.Is(err, tt.ret) {
				t.Fatalf("got %v, want an error wrapping ErrUnavailable and %v", err, tt.ret)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not say %q", err, tt.want)
			}
			if m.shutdowns != 0 {
				t.Errorf("Shutdown called after failed Init")
			}
		})
	}
}

// Failures of NVML as a whole fail Discover, as ErrUnavailable.
func TestDiscoverSystemErrors(t *testing.T) {
	fail := nvml.ERROR_UNKNOWN
	tests := []struct {
		name    string
		breakIt func(m *mockLib)
		want    string
	}{
		{"driver version", func(m *mockLib) {
			m.lib.SystemGetDriverVersionFunc = func() (string, nvml.Return) { return "", fail }
		}, "nvmlSystemGetDriverVersion"},
		{"CUDA version", func(m *mockLib) {
			m.lib.SystemGetCudaDriverVersionFunc = func() (int, nvml.Return) { return 0, fail }
		}, "nvmlSystemGetCudaDriverVersion"},
		{"count", func(m *mockLib) {
			m.lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_DRIVER_NOT_LOADED }
		}, "nvmlDeviceGetCount"},
		{"count and shutdown", func(m *mockLib) {
			m.lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, fail }
			m.lib.ShutdownFunc = func() nvml.Return { m.shutdowns++; return nvml.ERROR_UNINITIALIZED }
		}, "nvmlDeviceGetCount"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newMockLib(newMockGPU(0), newMockGPU(1))
			tt.breakIt(m)
			inv, err := m.discover(staticSystem{})
			if !errors.Is(err, hardware.ErrUnavailable) || inv != nil {
				t.Fatalf("got %+v, %v; want an error wrapping ErrUnavailable", inv, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not name %s", err, tt.want)
			}
			if m.shutdowns != 1 {
				t.Errorf("Shutdown called %d times, want 1", m.shutdowns)
			}
		})
	}

	// Majors do not come from NVML: an error, but not ErrUnavailable.
	m := newMockLib(newMockGPU(0))
	_, err := m.discover(staticSystem{majorsErr: errors.New("read device majors: no /proc/devices")})
	if err == nil || errors.Is(err, hardware.ErrUnavailable) || !strings.Contains(err.Error(), "read device majors") {
		t.Errorf("majors unreadable: got %v", err)
	}
}

func gpuUUIDs(inv *hardware.Inventory) []string {
	var uuids []string
	for _, g := range inv.GPUs {
		uuids = append(uuids, g.UUID)
	}
	return uuids
}

// A failing nvmlShutdown does not spoil the snapshot taken before it.
func TestDiscoverShutdownFailure(t *testing.T) {
	m := newMockLib(newMockGPU(0), newMockGPU(1))
	m.lib.ShutdownFunc = func() nvml.Return { m.shutdowns++; return nvml.ERROR_UNKNOWN }
	inv, err := m.discover(staticSystem{})
	if err != nil {
		t.Fatalf("got %v, want the inventory", err)
	}
	if got := gpuUUIDs(inv); !reflect.DeepEqual(got, []string{"GPU-0", "GPU-1"}) {
		t.Errorf("discovered %v", got)
	}
	want := []hardware.Problem{{Index: -1, Err: "nvmlShutdown: " + nvml.ERROR_UNKNOWN.Error()}}
	if !reflect.DeepEqual(inv.Problems, want) {
		t.Errorf("problems: got %+v, want %+v", inv.Problems, want)
	}
}

func TestDiscoverSkipsDisplay(t *testing.T) {
	display := newMockGPU(1)
	display.GetNameFunc = func() (string, nvml.Return) { return "DGX Display", nvml.SUCCESS }
	inv, err := newMockLib(newMockGPU(0), display).discover(staticSystem{})
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) != 1 || inv.GPUs[0].UUID != "GPU-0" {
		t.Errorf("got %+v, want only GPU-0", inv.GPUs)
	}
}

func TestDiscoverCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := nvmlhw.NewFromInterface(newMockLib(newMockGPU(0)).lib, noTopology{}, staticSystem{}).Discover(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("got %v, want context.Canceled", err)
	}
}

func TestRealWithoutDriver(t *testing.T) {
	root := t.TempDir()
	_, err := nvmlhw.NewReal(nvmlhw.WithDriverRoot(root)).Discover(context.Background())
	if !errors.Is(err, hardware.ErrUnavailable) || !strings.Contains(err.Error(), "libnvidia-ml.so.1 not found under driver root "+root) {
		t.Errorf("got %v, want ErrUnavailable naming the driver root", err)
	}

	// A file that is no library: found, but loading fails.
	lib := filepath.Join(root, "usr", "lib64", "libnvidia-ml.so.1")
	if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = nvmlhw.NewReal(nvmlhw.WithDriverRoot(root)).Discover(context.Background())
	if !errors.Is(err, hardware.ErrUnavailable) || !errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) || !strings.Contains(err.Error(), "cannot load "+lib) {
		t.Errorf("got %v, want ErrUnavailable saying %s cannot be loaded", err, lib)
	}
}

// TestRealHost runs discovery against this machine: on a node without the
// NVIDIA driver it must report ErrUnavailable, on a GPU node it must
// succeed. Set GPUDRA_REQUIRE_GPU=1 to make the GPU case mandatory.
func TestRealHost(t *testing.T) {
	inv, err := nvmlhw.NewReal().Discover(context.Background())
	if err != nil {
		if !errors.Is(err, hardware.ErrUnavailable) {
			t.Fatalf("got %v, want success or ErrUnavailable", err)
		}
		if os.Getenv("GPUDRA_REQUIRE_GPU") != "" {
			t.Fatalf("GPUDRA_REQUIRE_GPU set but: %v", err)
		}
		t.Skipf("no NVIDIA driver here: %v", err)
	}
	t.Logf("driver %s, CUDA %s, majors %+v", inv.DriverVersion, inv.CUDADriverVersion, inv.Majors)
	for _, p := range inv.Problems {
		t.Logf("problem: %+v", p)
	}
	if inv.Majors.NVIDIA != 195 || inv.DriverVersion == "" || inv.CUDADriverVersion == "" {
		t.Errorf("implausible inventory: %+v", inv)
	}
	for _, g := range inv.GPUs {
		t.Logf("GPU %d minor %d %s %q brand %q arch %q cc %s memory %d MiB bus %s root %q NUMA %v MIG capable %v enabled %v, %d MIG devices",
			g.Index, g.Minor, g.UUID, g.ProductName, g.Brand, g.Architecture, g.CUDAComputeCapability,
			g.MemoryBytes>>20, g.PCIBusID, g.PCIeRoot, g.NUMANode, g.MIGCapable, g.MIGEnabled, len(g.MIGDevices))
		for _, m := range g.MIGDevices {
			t.Logf("  MIG %+v", m)
		}
		if !strings.HasPrefix(g.UUID, "GPU-") || g.MemoryBytes == 0 || !busIDRE.MatchString(g.PCIBusID) {
			t.Errorf("GPU %d: implausible UUID %q, memory %d or bus ID %q", g.Index, g.UUID, g.MemoryBytes, g.PCIBusID)
		}
		for _, m := range g.MIGDevices {
			if !strings.HasPrefix(m.UUID, "MIG-") || m.Profile == "" || m.GICapMinor == 0 || m.CICapMinor == 0 {
				t.Errorf("GPU %d: implausible MIG device %+v", g.Index, m)
			}
		}
	}
}
