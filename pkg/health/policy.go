// Package health decides what a GPU's health events mean for the devices
// a node publishes: which events taint (the policy), what each GPU's
// condition is (the state, a pure function of the events), which device
// taints follow from it (KEP-5055), and how often a changing condition may
// be republished (the debouncer). docs/guides/health.md has the table.
package health

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
)

// ApplicationXIDs are the XIDs NVIDIA's drivers (the DRA driver and the
// device plugin) treat as application errors: the GPU is fine, the
// application that caused them failed. They taint nothing by default.
var ApplicationXIDs = []uint64{
	13,  // graphics engine exception
	31,  // GPU memory page fault
	43,  // GPU stopped processing
	45,  // preemptive cleanup, due to previous errors
	68,  // video processor exception
	109, // context switch timeout
}

// Policy says which health events taint a GPU's devices, and how.
type Policy struct {
	// IgnoreXIDs change nothing.
	IgnoreXIDs []uint64
	// FaultEffect is the effect of the taints of XIDs and double-bit ECC
	// errors.
	FaultEffect resourceapi.DeviceTaintEffect
	// LostEffect is the effect of the taint of a GPU lost off the bus.
	LostEffect resourceapi.DeviceTaintEffect
}

// DefaultPolicy ignores [ApplicationXIDs], taints other faults NoSchedule
// (running pods finish or fail on their own; no new claim gets the GPU)
// and a lost GPU NoExecute (its pods cannot work any more).
func DefaultPolicy() Policy {
	return Policy{
		IgnoreXIDs:  slices.Clone(ApplicationXIDs),
		FaultEffect: resourceapi.DeviceTaintEffectNoSchedule,
		LostEffect:  resourceapi.DeviceTaintEffectNoExecute,
	}
}

// Effects are the taint effects a policy may use.
var Effects = []resourceapi.DeviceTaintEffect{
	resourceapi.DeviceTaintEffectNone, resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute,
}

// ParseEffect reads a taint effect; the error names the flag and the
// allowed values.
func ParseEffect(flag, s string) (resourceapi.DeviceTaintEffect, error) {
	for _, e := range Effects {
		if string(e) == s {
			return e, nil
		}
	}
	return "", fmt.Errorf("--%s %q: must be one of %s", flag, s, effectNames())
}

func effectNames() string {
	names := make([]string, len(Effects))
	for i, e := range Effects {
		names[i] = string(e)
	}
	return strings.Join(names, ", ")
}

// ParseXIDs reads a comma-separated list of XID numbers ("13,31,43"); an
// empty string is an empty list. The error names the flag and the value.
func ParseXIDs(flag, s string) ([]uint64, error) {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 32)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("--%s %q: %q is not an XID; want positive numbers separated by commas, as in %s", flag, s, f, FormatXIDs(ApplicationXIDs))
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// FormatXIDs renders XIDs as ParseXIDs reads them.
func FormatXIDs(xids []uint64) string {
	parts := make([]string, len(xids))
	for i, x := range xids {
		parts[i] = strconv.FormatUint(x, 10)
	}
	return strings.Join(parts, ",")
}

// Validate checks the effects.
func (p Policy) Validate() error {
	for _, e := range []resourceapi.DeviceTaintEffect{p.FaultEffect, p.LostEffect} {
		if !slices.Contains(Effects, e) {
			return fmt.Errorf("health policy: taint effect %q: must be one of %s", e, effectNames())
		}
	}
	return nil
}

// Taint keys, as NVIDIA's DRA driver names them under its driver name
// (gpu.nvidia.com/xid, gpu.nvidia.com/gpu-lost), so that tolerations
// written for it carry over; ecc-dbe is gpudra's own.
const (
	KeyXID     = "xid"
	KeyGPULost = "gpu-lost"
	KeyECCDBE  = "ecc-dbe"
)

// TaintKey returns the taint key of a kind under the driver's name:
// "gpu.nvidia.com/xid".
func TaintKey(driverName, key string) string { return driverName + "/" + key }
