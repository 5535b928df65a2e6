package health

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// Condition is what is wrong with one GPU; the zero value is healthy.
type Condition struct {
	// XID is the last XID that tainted the GPU; 0 for none.
	XID uint64
	// ECC is set after a double-bit ECC error.
	ECC bool
	// Lost is set while the GPU is off the bus.
	Lost bool
	// Since is when the GPU became unhealthy.
	Since time.Time
	// Source says where the last event came from: "" for the GPU as a
	// whole, "MIG device GI 1, CI 0" for one of its MIG devices. Every
	// fault gpudra taints for is taken as GPU-wide (docs/guides/health.md).
	Source string
}

// Healthy reports whether nothing is wrong.
func (c Condition) Healthy() bool { return c.XID == 0 && !c.ECC && !c.Lost }

// String says what is wrong: "xid 79, gpu-lost"; "healthy" when nothing.
func (c Condition) String() string {
	var parts []string
	if c.XID != 0 {
		parts = append(parts, fmt.Sprintf("xid %d", c.XID))
	}
	if c.ECC {
		parts = append(parts, KeyECCDBE)
	}
	if c.Lost {
		parts = append(parts, KeyGPULost)
	}
	if len(parts) == 0 {
		return "healthy"
	}
	s := strings.Join(parts, ", ")
	if c.Source != "" {
		s += " (last from " + c.Source + ")"
	}
	return s
}

// Taints are the device taints of a GPU in this condition, for every
// device of the GPU: its full GPU, its VFIO device, its MIG devices and
// placements. Keys are under the driver's name ([TaintKey]); TimeAdded is
// left to the API server, which sets it when the taint first appears.
func (c Condition) Taints(driverName string, p Policy) []resourceapi.DeviceTaint {
	var out []resourceapi.DeviceTaint
	if c.Lost {
		out = append(out, resourceapi.DeviceTaint{Key: TaintKey(driverName, KeyGPULost), Effect: p.LostEffect})
	}
	if c.XID != 0 {
		out = append(out, resourceapi.DeviceTaint{Key: TaintKey(driverName, KeyXID), Value: strconv.FormatUint(c.XID, 10), Effect: p.FaultEffect})
	}
	if c.ECC {
		out = append(out, resourceapi.DeviceTaint{Key: TaintKey(driverName, KeyECCDBE), Effect: p.FaultEffect})
	}
	return out
}

// State is the condition of a node's GPUs, by UUID; GPUs it does not name
// are healthy. A State is never modified: Apply returns a new one, so a
// publication can hold one while events go on.
type State struct {
	gpus map[string]Condition
}

// Transition is what one event did to one GPU.
type Transition struct {
	GPU           string
	Event         hardware.HealthEvent
	Before, After Condition
	// Ignored is set for an XID the policy ignores.
	Ignored bool
}

// Changed reports whether the GPU's taints changed.
func (t Transition) Changed() bool { return !sameTaints(t.Before, t.After) }

func sameTaints(a, b Condition) bool { return a.XID == b.XID && a.ECC == b.ECC && a.Lost == b.Lost }

// Apply returns the state after e under the policy p, and what changed.
// A nil s is a node whose GPUs are all healthy.
func (s *State) Apply(p Policy, e hardware.HealthEvent) (*State, Transition) {
	before := s.Condition(e.GPUUUID)
	after := before
	t := Transition{GPU: e.GPUUUID, Event: e, Before: before}
	switch e.Kind {
	case hardware.HealthXID:
		if slices.Contains(p.IgnoreXIDs, e.XID) {
			t.Ignored = true
			break
		}
		after.XID = e.XID
	case hardware.HealthECCDoubleBit:
		after.ECC = true
	case hardware.HealthGPULost:
		after.Lost = true
	case hardware.HealthRecovered:
		after = Condition{}
	}
	if !after.Healthy() && !t.Ignored && e.Kind != hardware.HealthRecovered {
		if before.Healthy() {
			after.Since = e.Time
		}
		after.Source = ""
		if e.MIG() {
			after.Source = fmt.Sprintf("MIG device GI %d, CI %d", e.GIID, e.CIID)
		}
	}
	t.After = after
	if before == after {
		return s, t
	}
	next := &State{gpus: map[string]Condition{}}
	if s != nil && s.gpus != nil {
		next.gpus = maps.Clone(s.gpus)
	}
	if after.Healthy() {
		delete(next.gpus, e.GPUUUID)
	} else {
		next.gpus[e.GPUUUID] = after
	}
	return next, t
}

// Condition returns the condition of the GPU with the given UUID.
func (s *State) Condition(gpuUUID string) Condition {
	if s == nil {
		return Condition{}
	}
	return s.gpus[gpuUUID]
}

// Unhealthy returns the UUIDs of the GPUs with something wrong, sorted.
func (s *State) Unhealthy() []string {
	if s == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(s.gpus))
}
