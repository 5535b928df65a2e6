// Package nvmlhw discovers a node's GPUs through NVML, and creates and
// destroys their MIG devices.
//
// The same discovery code runs over the real libnvidia-ml.so (NewReal) and
// over any other nvml.Interface (NewFromInterface), which is how the
// simulated fleets of package sim exercise it. What NVML does not answer
// (PCIe topology, device majors, MIG capability minors) comes from the
// small [Topology] and [SystemInfo] interfaces.
package nvmlhw

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// libraryName is the soname of the NVML library.
const libraryName = "libnvidia-ml.so.1"

// libraryDirs are where driver installations put libnvidia-ml.so.1,
// relative to the driver root: Debian multiarch, then RPM lib64, then the
// plain directories some container images use.
var libraryDirs = []string{
	"usr/lib/x86_64-linux-gnu",
	"usr/lib/aarch64-linux-gnu",
	"usr/lib64",
	"lib/x86_64-linux-gnu",
	"lib/aarch64-linux-gnu",
	"lib64",
	"usr/lib",
	"lib",
}

// Discoverer implements [hardware.Hardware], [hardware.MIGManager],
// [hardware.MIGModeSwitcher] and [hardware.HealthWatcher] over NVML.
//
// Its calls are serialized, Discover with MIG operations: NVML
// initialization and go-nvml's library loading keep process-wide state,
// discovery and MIG reconfiguration are rare enough that running one at a
// time costs little, and a Discover never sees a MIG device half made.
type Discoverer struct {
	mu   sync.Mutex
	open func() (nvml.Interface, string, error)
	topo Topology
	sys  SystemInfo
	// healthPoll and healthWait, see [WithHealthPolling].
	healthPoll, healthWait time.Duration
}

var (
	_ hardware.Hardware      = (*Discoverer)(nil)
	_ hardware.HealthWatcher = (*Discoverer)(nil)
)

// Option configures [NewReal].
type Option func(*options)

type options struct {
	driverRoot string
	sysfsRoot  string
	procRoot   string
	healthPoll time.Duration
	healthWait time.Duration
}

func newOptions(opts []Option) options {
	o := options{driverRoot: "/", sysfsRoot: "/sys", procRoot: "/proc", healthPoll: DefaultHealthPollInterval, healthWait: DefaultHealthWaitTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithDriverRoot sets the root of the driver installation under which
// libnvidia-ml.so.1 is looked up, for example /run/nvidia/driver when the
// driver runs in a container. The default is "/".
func WithDriverRoot(root string) Option {
	return func(o *options) { o.driverRoot = root }
}

// WithSysfsRoot sets where sysfs is mounted. The default is "/sys".
func WithSysfsRoot(root string) Option {
	return func(o *options) { o.sysfsRoot = root }
}

// WithProcRoot sets where the host's procfs is mounted. The default is
// "/proc".
func WithProcRoot(root string) Option {
	return func(o *options) { o.procRoot = root }
}

// NewReal returns a Discoverer over the node's real NVML library. It does
// not touch the library: each call (Discover or a MIG operation) looks it
// up, initializes NVML and shuts it down again, so a driver that comes up
// after the plugin is found on a later call.
func NewReal(opts ...Option) *Discoverer {
	o := newOptions(opts)
	r := &realLibrary{driverRoot: o.driverRoot}
	return &Discoverer{
		open:       r.open,
		topo:       NewSysfsTopology(o.sysfsRoot),
		sys:        NewProcSystemInfo(o.procRoot),
		healthPoll: o.healthPoll,
		healthWait: o.healthWait,
	}
}

// NewFromInterface returns a Discoverer that runs the same discovery over
// lib, which may be a simulated NVML. Of the options, only
// [WithHealthPolling] applies.
func NewFromInterface(lib nvml.Interface, topo Topology, sys SystemInfo, opts ...Option) *Discoverer {
	o := newOptions(opts)
	return &Discoverer{
		open:       func() (nvml.Interface, string, error) { return lib, "NVML", nil },
		topo:       topo,
		sys:        sys,
		healthPoll: o.healthPoll,
		healthWait: o.healthWait,
	}
}

// realLibrary finds libnvidia-ml.so.1 under a driver root and keeps one
// go-nvml handle per path, so that repeated Init/Shutdown pairs reuse it.
type realLibrary struct {
	driverRoot string
	path       string
	lib        nvml.Interface
}

func (r *realLibrary) open() (nvml.Interface, string, error) {
	path, err := r.find()
	if err != nil {
		return nil, "", err
	}
	if r.lib == nil || r.path != path {
		r.lib = nvml.New(nvml.WithLibraryPath(path))
		r.path = path
	}
	return r.lib, path, nil
}

// find returns the path of libnvidia-ml.so.1 under the driver root. Under
// "/" it falls back to the bare soname, leaving the search to the dynamic
// loader (ld.so.cache, LD_LIBRARY_PATH).
func (r *realLibrary) find() (string, error) {
	var tried []string
	for _, dir := range libraryDirs {
		path := filepath.Join(r.driverRoot, dir, libraryName)
		if info, err := os.Stat(path); err == nil && !info.IsDir() {
			return path, nil
		}
		tried = append(tried, filepath.Join(r.driverRoot, dir))
	}
	if filepath.Clean(r.driverRoot) == "/" {
		return libraryName, nil
	}
	return "", fmt.Errorf("%w: %s not found under driver root %s (looked in %v): is the NVIDIA driver installed there?",
		hardware.ErrUnavailable, libraryName, r.driverRoot, tried)
}

// Discover implements [hardware.Hardware]. Each call initializes NVML and
// shuts it down again.
//
// An error wrapping [hardware.ErrUnavailable] means NVML cannot be used at
// all: library missing, nvmlInit failing (driver not loaded, no
// permission), or the system-wide queries (driver version, device count)
// failing after it. A GPU whose identity (handle, UUID, name, minor) cannot
// be read, or that answers any query with ERROR_GPU_IS_LOST, is left out
// and reported in the inventory's Problems, naming the
// GPU (index and UUID) and the NVML call; so is a MIG device that cannot be
// read or that gpudra does not model, while its GPU and the GPU's other MIG
// devices stay. A GPU whose other properties NVML or sysfs do not answer
// is kept without them, and lists them in its Unread. A failing
// nvmlShutdown after a good discovery is reported as a problem with Index
// -1: the snapshot it follows is still right.
func (d *Discoverer) Discover(ctx context.Context) (inv *hardware.Inventory, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	lib, err := d.initialized(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		// When discovery failed, its error is the news.
		if ret := lib.Shutdown(); ret != nvml.SUCCESS && err == nil {
			inv.Problems = append(inv.Problems, hardware.Problem{Index: -1, Err: fmt.Sprintf("nvmlShutdown: %v", ret)})
		}
	}()
	return d.discover(ctx, lib)
}

// initialized loads and initializes NVML for one call; the caller holds
// d.mu and shuts NVML down when done. INIT_FLAG_NO_GPUS: a node whose GPUs
// are all bound to vfio-pci still has a working driver and an empty
// inventory, not an outage.
func (d *Discoverer) initialized(ctx context.Context) (nvml.Interface, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	lib, source, err := d.open()
	if err != nil {
		return nil, err
	}
	if ret := lib.InitWithFlags(nvml.INIT_FLAG_NO_GPUS); ret != nvml.SUCCESS {
		return nil, initError(source, ret)
	}
	return lib, nil
}

// initError explains a failed nvmlInit. Every such failure means NVML is
// unusable right now, so all of them wrap [hardware.ErrUnavailable].
func initError(source string, ret nvml.Return) error {
	var why string
	switch ret {
	case nvml.ERROR_LIBRARY_NOT_FOUND:
		why = fmt.Sprintf("cannot load %s; is the NVIDIA driver installed?", source)
	case nvml.ERROR_DRIVER_NOT_LOADED:
		why = "the NVIDIA kernel driver is not loaded"
	case nvml.ERROR_NO_PERMISSION:
		why = "no permission to open /dev/nvidiactl and /dev/nvidia<N>; run privileged or mount the device nodes"
	case nvml.ERROR_LIB_RM_VERSION_MISMATCH:
		why = fmt.Sprintf("%s does not match the version of the loaded kernel driver", source)
	default:
		why = fmt.Sprintf("initialize NVML from %s", source)
	}
	return fmt.Errorf("%w: %s: nvmlInit: %w", hardware.ErrUnavailable, why, ret)
}

// discover reads the inventory from an initialized NVML.
func (d *Discoverer) discover(ctx context.Context, lib nvml.Interface) (*hardware.Inventory, error) {
	driverVersion, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: nvmlSystemGetDriverVersion: %w", hardware.ErrUnavailable, ret)
	}
	cudaVersion, ret := lib.SystemGetCudaDriverVersion()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: nvmlSystemGetCudaDriverVersion: %w", hardware.ErrUnavailable, ret)
	}
	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: nvmlDeviceGetCount: %w", hardware.ErrUnavailable, ret)
	}
	majors, err := d.sys.Majors()
	if err != nil {
		return nil, err
	}

	inv := &hardware.Inventory{
		DriverVersion:     driverVersion,
		CUDADriverVersion: formatCUDAVersion(cudaVersion),
		Majors:            majors,
		GPUs:              []hardware.GPU{},
	}
	g := newGPUReader(lib, d.topo, d.sys)
	for i := 0; i < count; i++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		gpu, ok, problems := g.read(i)
		if ok {
			inv.GPUs = append(inv.GPUs, gpu)
		}
		inv.Problems = append(inv.Problems, problems...)
	}
	return inv, nil
}

// formatCUDAVersion turns NVML's CUDA driver version (1000*major +
// 10*minor, e.g. 12080) into "major.minor" ("12.8").
func formatCUDAVersion(v int) string {
	return fmt.Sprintf("%d.%d", v/1000, (v%1000)/10)
}
