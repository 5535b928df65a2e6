package sim

import (
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// The fake implements the NVML calls that discovery (ours and go-nvlib's)
// and MIG management make, as methods on types that embed go-nvml's moq
// types. The moq types only catch calls nobody implemented here, with a
// panic naming the method; their Func fields are not used because moq
// records every call, which would grow without bound in a long-running
// simulation.
//
// Files: this one holds the library; fakedevice.go the GPUs and what they
// answer about MIG; fakemig.go the GPU instance, compute instance and MIG
// device handles; fakemigops.go what changes MIG state.
//
// The fake is safe for concurrent use: one mutex per fake guards all that
// can change (MIG modes, minors, GPU and compute instances, MIG devices).
// Every method first counts its call in the Faults, if any, and returns an
// injected error before touching anything.

// fakeNVML implements nvml.Interface for one simulated node.
type fakeNVML struct {
	mock.Interface
	faults        *Faults
	health        *HealthEvents
	node          string
	driverVersion string
	cudaVersion   int
	devices       []*fakeDevice
	// minorsAfterSwitch are the minors GPUs, by UUID, come back with after
	// a MIG mode switch.
	minorsAfterSwitch map[string]int
	// stateFile, if set, holds what can change (see state.go), shared
	// with the other processes that drive it (shared.go): lockFile locks
	// it, lastState is what this process last read or wrote of it.
	stateFile string
	lastState []byte
	// booted is when the fake was built: the simulated node's boot, from
	// which a fabric's completesAfter counts.
	booted time.Time

	mu sync.Mutex
	// created counts the compute instances created, which makes the
	// UUIDs of their MIG devices new each time. Guarded by mu.
	created int
}

// newFakeNVML builds the fake NVML of a resolved node.
func newFakeNVML(n *Node, opts ...HardwareOption) *fakeNVML {
	var o hardwareOptions
	for _, opt := range opts {
		opt(&o)
	}
	f := &fakeNVML{
		faults: o.faults, health: o.health, node: n.Name, minorsAfterSwitch: o.minorsAfterSwitch, stateFile: o.stateFile,
		driverVersion: n.DriverVersion, cudaVersion: cudaVersionInt(n.CUDADriverVersion),
		booted: time.Now(),
	}
	for i := range n.GPUs {
		g := &n.GPUs[i]
		if g.BoundTo != "" {
			continue // NVML does not see a GPU bound to a VFIO driver
		}
		d := &fakeDevice{
			nv: f, index: len(f.devices), minor: *g.Minor, uuid: g.UUID, model: models()[g.Model], busID: g.PCIBusID,
			memoryBytes: g.MemoryMiB * 1024 * 1024, migEnabled: g.MIGEnabled, migPending: g.MIGEnabled,
			fabric: n.Fabric, unanswered: unanswered(g.NVMLErrors),
		}
		for _, md := range g.MIGDevices {
			prof, _ := d.model.profile(md.Profile)
			gi := d.newGI(prof, *md.PlacementStart)
			// A GPU instance holds one compute instance spanning it or,
			// split, as many of ComputeSlices slices as fit, numbered
			// from 0 and placed side by side.
			c := md.ComputeSlices
			if c == 0 {
				c = prof.Slices
			}
			for k := 0; k < prof.Slices/c; k++ {
				uuid := md.UUID
				if k > 0 {
					uuid = ciUUID(n.Name, i, prof.Name, *md.PlacementStart, k)
				}
				gi.addCI(k, k*c, c, uuid)
			}
			d.gis = append(d.gis, gi)
		}
		f.devices = append(f.devices, d)
	}
	f.health.addNode(n.Name, len(f.devices))
	return f
}

// cudaVersionInt encodes "12.8" as NVML does: 12080.
func cudaVersionInt(v string) int {
	major, minor, _ := strings.Cut(v, ".")
	ma, _ := strconv.Atoi(major)
	mi, _ := strconv.Atoi(minor)
	return ma*1000 + mi*10
}

// Init implements nvml.Interface.
func (f *fakeNVML) Init() nvml.Return { return f.faults.hit("nvmlInit") }

// InitWithFlags implements nvml.Interface.
func (f *fakeNVML) InitWithFlags(uint32) nvml.Return { return f.faults.hit("nvmlInitWithFlags") }

// Shutdown implements nvml.Interface.
func (f *fakeNVML) Shutdown() nvml.Return { return f.faults.hit("nvmlShutdown") }

// Extensions implements nvml.Interface.
func (f *fakeNVML) Extensions() nvml.ExtendedInterface { return fakeExtensions{} }

// SystemGetDriverVersion implements nvml.Interface.
func (f *fakeNVML) SystemGetDriverVersion() (string, nvml.Return) {
	if ret := f.faults.hit("nvmlSystemGetDriverVersion"); ret != nvml.SUCCESS {
		return "", ret
	}
	return f.driverVersion, nvml.SUCCESS
}

// SystemGetCudaDriverVersion implements nvml.Interface.
func (f *fakeNVML) SystemGetCudaDriverVersion() (int, nvml.Return) {
	if ret := f.faults.hit("nvmlSystemGetCudaDriverVersion"); ret != nvml.SUCCESS {
		return 0, ret
	}
	return f.cudaVersion, nvml.SUCCESS
}

// DeviceGetCount implements nvml.Interface.
func (f *fakeNVML) DeviceGetCount() (int, nvml.Return) {
	if ret := f.faults.hit("nvmlDeviceGetCount"); ret != nvml.SUCCESS {
		return 0, ret
	}
	return len(f.devices), nvml.SUCCESS
}

// DeviceGetHandleByIndex implements nvml.Interface.
func (f *fakeNVML) DeviceGetHandleByIndex(i int) (nvml.Device, nvml.Return) {
	if ret := f.faults.hit("nvmlDeviceGetHandleByIndex"); ret != nvml.SUCCESS {
		return nil, ret
	}
	if i < 0 || i >= len(f.devices) {
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return f.devices[i], nvml.SUCCESS
}

// DeviceGetHandleByUUID implements nvml.Interface, for GPUs and MIG
// devices.
func (f *fakeNVML) DeviceGetHandleByUUID(uuid string) (nvml.Device, nvml.Return) {
	if ret := f.faults.hit("nvmlDeviceGetHandleByUUID"); ret != nvml.SUCCESS {
		return nil, ret
	}
	defer f.lock()()
	for _, d := range f.devices {
		if d.uuid == uuid {
			return d, nvml.SUCCESS
		}
		for _, m := range d.migs {
			if m.uuid == uuid {
				return m, nvml.SUCCESS
			}
		}
	}
	return nil, nvml.ERROR_NOT_FOUND
}

// fakeExtensions reports every symbol as present.
type fakeExtensions struct{}

// LookupSymbol implements nvml.ExtendedInterface.
func (fakeExtensions) LookupSymbol(string) error { return nil }
