package sim

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Quirks of real nodes that a fleet file can declare, so that a user can
// reproduce the node they have: NVML functions a GPU leaves unanswered
// (GB10's memory info) and a topology that sysfs does not tell (a VM's
// virtual PCI bus).

// Topology is what a node's sysfs tells of where its GPUs sit, when it is
// not what a bare-metal server tells.
type Topology struct {
	// PCIeRoot is TopologyUnknown when no GPU's PCIe root can be read, as
	// in VMs whose GPUs sit on a virtual PCI bus (Azure's Hyper-V VMs);
	// empty: every GPU has its own or its model's usual root.
	PCIeRoot string `json:"pcieRoot,omitempty"`
	// NUMANode is TopologyNone when no GPU has a NUMA affinity, as sysfs
	// says with numa_node -1 in VMs without a virtual NUMA topology; empty:
	// every GPU has its own or its model's usual node.
	NUMANode string `json:"numaNode,omitempty"`
}

// The values of [Topology]'s fields, and of a GPU's pcieRoot that cannot
// be read.
const (
	TopologyUnknown = "unknown"
	TopologyNone    = "none"
)

// nvmlReturns are the NVML errors fleet files name, without their
// "ERROR_" prefix (go-nvml has no parser), and SUCCESS, which lets a GPU
// answer a call that its model leaves unanswered.
var nvmlReturns = map[string]nvml.Return{
	"SUCCESS":                   nvml.SUCCESS,
	"UNINITIALIZED":             nvml.ERROR_UNINITIALIZED,
	"INVALID_ARGUMENT":          nvml.ERROR_INVALID_ARGUMENT,
	"NOT_SUPPORTED":             nvml.ERROR_NOT_SUPPORTED,
	"NO_PERMISSION":             nvml.ERROR_NO_PERMISSION,
	"NOT_FOUND":                 nvml.ERROR_NOT_FOUND,
	"INSUFFICIENT_SIZE":         nvml.ERROR_INSUFFICIENT_SIZE,
	"INSUFFICIENT_POWER":        nvml.ERROR_INSUFFICIENT_POWER,
	"DRIVER_NOT_LOADED":         nvml.ERROR_DRIVER_NOT_LOADED,
	"TIMEOUT":                   nvml.ERROR_TIMEOUT,
	"IRQ_ISSUE":                 nvml.ERROR_IRQ_ISSUE,
	"CORRUPTED_INFOROM":         nvml.ERROR_CORRUPTED_INFOROM,
	"GPU_IS_LOST":               nvml.ERROR_GPU_IS_LOST,
	"RESET_REQUIRED":            nvml.ERROR_RESET_REQUIRED,
	"OPERATING_SYSTEM":          nvml.ERROR_OPERATING_SYSTEM,
	"LIB_RM_VERSION_MISMATCH":   nvml.ERROR_LIB_RM_VERSION_MISMATCH,
	"IN_USE":                    nvml.ERROR_IN_USE,
	"MEMORY":                    nvml.ERROR_MEMORY,
	"NO_DATA":                   nvml.ERROR_NO_DATA,
	"INSUFFICIENT_RESOURCES":    nvml.ERROR_INSUFFICIENT_RESOURCES,
	"ARGUMENT_VERSION_MISMATCH": nvml.ERROR_ARGUMENT_VERSION_MISMATCH,
	"DEPRECATED":                nvml.ERROR_DEPRECATED,
	"NOT_READY":                 nvml.ERROR_NOT_READY,
	"GPU_NOT_FOUND":             nvml.ERROR_GPU_NOT_FOUND,
	"INVALID_STATE":             nvml.ERROR_INVALID_STATE,
	"UNKNOWN":                   nvml.ERROR_UNKNOWN,
}

// libraryCalls are the NVML functions the fake serves that are not asked
// of one GPU, so a GPU cannot leave them unanswered.
var libraryCalls = []string{
	"nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByUUID",
	"nvmlInit", "nvmlInitWithFlags", "nvmlShutdown",
	"nvmlSystemGetCudaDriverVersion", "nvmlSystemGetDriverVersion",
}

// gpuCalls returns the NVML functions a GPU may leave unanswered, sorted.
func gpuCalls() []string {
	return slices.DeleteFunc(NVMLCalls(), func(c string) bool { return slices.Contains(libraryCalls, c) })
}

// nvmlReturnNames lists the names nvmlErrors accepts, for error messages.
func nvmlReturnNames() string {
	names := slices.Sorted(maps.Keys(nvmlReturns))
	return strings.Join(names, ", ")
}

// parseNVMLReturn maps an NVML return name, with or without "ERROR_"
// (case-insensitive), to its value and its canonical name as
// nvml.Return.String writes it ("ERROR_NOT_SUPPORTED", "SUCCESS").
func parseNVMLReturn(name string) (nvml.Return, string, bool) {
	n := strings.TrimPrefix(strings.ToUpper(name), "ERROR_")
	ret, ok := nvmlReturns[n]
	if !ok {
		return 0, "", false
	}
	if ret == nvml.SUCCESS {
		return ret, n, true
	}
	return ret, "ERROR_" + n, true
}

// resolveNVMLErrors validates the nvmlErrors map at field and returns it
// with canonical names, merged over base (which it leaves alone).
func resolveNVMLErrors(p *problems, field string, errs, base map[string]string) map[string]string {
	if len(errs) == 0 && len(base) == 0 {
		return nil
	}
	out := maps.Clone(base)
	if out == nil {
		out = map[string]string{}
	}
	for _, call := range slices.Sorted(maps.Keys(errs)) {
		name := errs[call]
		if !slices.Contains(gpuCalls(), call) {
			p.add(field, "unknown NVML function %q (a GPU can leave unanswered: %s)", call, strings.Join(gpuCalls(), ", "))
			continue
		}
		_, canon, ok := parseNVMLReturn(name)
		if !ok {
			p.add(fmt.Sprintf("%s.%s", field, call), "unknown NVML error %q (allowed, with or without ERROR_: %s)", name, nvmlReturnNames())
			continue
		}
		out[call] = canon
	}
	return out
}

// resolve validates the node's topology.
func (t *Topology) resolve(p *problems) {
	if t == nil {
		return
	}
	if t.PCIeRoot != "" && t.PCIeRoot != TopologyUnknown {
		p.add("topology.pcieRoot", "%q: must be %q or unset", t.PCIeRoot, TopologyUnknown)
	}
	if t.NUMANode != "" && t.NUMANode != TopologyNone {
		p.add("topology.numaNode", "%q: must be %q or unset", t.NUMANode, TopologyNone)
	}
}

// errUnknownPCIeRoot is what the topology of a GPU whose pcieRoot is
// unknown answers, as nvmlhw's sysfs topology does for a device whose sysfs
// path has no PCIe root.
var errUnknownPCIeRoot = errors.New("no PCIe root (the fleet file says it is unknown)")

// unanswered turns a resolved GPU's nvmlErrors into what its fake device
// answers.
func unanswered(errs map[string]string) map[string]nvml.Return {
	out := map[string]nvml.Return{}
	for call, name := range errs {
		if ret, _, _ := parseNVMLReturn(name); ret != nvml.SUCCESS {
			out[call] = ret
		}
	}
	return out
}
