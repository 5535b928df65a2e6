package sim

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlCalls are the NVML functions the fake serves, as nvml.h names them
// (without version suffixes). Every method of the fake counts its calls
// under one of these names; a MIG device handle's calls count with the
// GPU's, as both are one function in NVML.
var nvmlCalls = []string{
	"nvmlComputeInstanceDestroy",
	"nvmlComputeInstanceGetInfo",
	"nvmlDeviceCreateGpuInstanceWithPlacement",
	"nvmlDeviceGetArchitecture",
	"nvmlDeviceGetAttributes",
	"nvmlDeviceGetBrand",
	"nvmlDeviceGetComputeInstanceId",
	"nvmlDeviceGetCount",
	"nvmlDeviceGetCudaComputeCapability",
	"nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
	"nvmlDeviceGetGpuInstanceById",
	"nvmlDeviceGetGpuInstanceId",
	"nvmlDeviceGetGpuInstancePossiblePlacements",
	"nvmlDeviceGetGpuInstanceProfileInfo",
	"nvmlDeviceGetGpuInstanceRemainingCapacity",
	"nvmlDeviceGetGpuInstances",
	"nvmlDeviceGetHandleByIndex",
	"nvmlDeviceGetHandleByUUID",
	"nvmlDeviceGetIndex",
	"nvmlDeviceGetMaxMigDeviceCount",
	"nvmlDeviceGetMemoryInfo",
	"nvmlDeviceGetMigDeviceHandleByIndex",
	"nvmlDeviceGetMigMode",
	"nvmlDeviceGetMinorNumber",
	"nvmlDeviceGetName",
	"nvmlDeviceGetPciInfo",
	"nvmlDeviceGetUUID",
	"nvmlDeviceIsMigDeviceHandle",
	"nvmlDeviceSetMigMode",
	"nvmlGpuInstanceCreateComputeInstance",
	"nvmlGpuInstanceDestroy",
	"nvmlGpuInstanceGetComputeInstanceById",
	"nvmlGpuInstanceGetComputeInstanceProfileInfo",
	"nvmlGpuInstanceGetComputeInstances",
	"nvmlGpuInstanceGetInfo",
	"nvmlInit",
	"nvmlInitWithFlags",
	"nvmlShutdown",
	"nvmlSystemGetCudaDriverVersion",
	"nvmlSystemGetDriverVersion",
}

// NVMLCalls returns the names of the NVML functions simulated hardware
// serves, which [Faults.Fail] accepts, sorted.
func NVMLCalls() []string { return slices.Clone(nvmlCalls) }

// Faults makes chosen NVML calls of simulated hardware fail, so that tests
// drive the error paths of the real nvmlhw code: a GPU lost while a MIG
// device is being created, a compute instance that cannot be destroyed.
// Pass it to [Node.Hardware] with [WithFaults].
//
// Calls are named as nvml.h names the functions ("nvmlGpuInstanceDestroy",
// see [NVMLCalls]) and counted from the moment the Faults is in use; the
// calls of go-nvlib count too, as it calls through the same NVML.
//
// The zero value fails nothing. A Faults is safe for concurrent use; the
// hardware of several nodes may share one and then counts together.
type Faults struct {
	mu    sync.Mutex
	calls map[string]int
	armed map[string][]armedFault
}

// armedFault makes call number at return ret.
type armedFault struct {
	at  int
	ret nvml.Return
}

// Fail makes the n-th call of the named NVML function from now on return
// ret: n = 1 is the next call. What else the function returns is then its
// zero value, and the call changes nothing. Several faults may be armed
// for one function.
//
// Fail panics for a function the fake does not serve, for n < 1 and for
// ret SUCCESS, so that a misspelt name cannot leave a test passing without
// the fault it meant to inject.
func (f *Faults) Fail(call string, n int, ret nvml.Return) {
	if !slices.Contains(nvmlCalls, call) {
		panic(fmt.Sprintf("sim: Faults.Fail: the fake does not serve %q (it serves %s)", call, strings.Join(nvmlCalls, ", ")))
	}
	if n < 1 || ret == nvml.SUCCESS {
		panic(fmt.Sprintf("sim: Faults.Fail(%q, %d, %v): want n >= 1 and an error", call, n, ret))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.armed == nil {
		f.armed = map[string][]armedFault{}
	}
	f.armed[call] = append(f.armed[call], armedFault{at: f.calls[call] + n, ret: ret})
}

// Calls returns how many times the named NVML function has been called.
func (f *Faults) Calls(call string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[call]
}

// hit counts a call of the named function and returns the fault armed for
// it, or SUCCESS. A nil Faults counts nothing.
func (f *Faults) hit(call string) nvml.Return {
	if f == nil {
		return nvml.SUCCESS
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls == nil {
		f.calls = map[string]int{}
	}
	f.calls[call]++
	armed := f.armed[call]
	for i, a := range armed {
		if a.at == f.calls[call] {
			f.armed[call] = slices.Delete(armed, i, i+1)
			return a.ret
		}
	}
	return nvml.SUCCESS
}
