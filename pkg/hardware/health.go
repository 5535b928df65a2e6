package hardware

import (
	"context"
	"fmt"
	"time"
)

// HealthWatcher is implemented by hardware that reports the health of its
// GPUs as it changes. It is optional: hardware without it is taken as
// healthy.
type HealthWatcher interface {
	// WatchHealth sends health events to out until ctx ends, then returns
	// nil. It returns an error when it cannot watch at all (no management
	// library); it watches the GPUs it can read and reports the others
	// through Discover's problems. Events of one GPU arrive in the order
	// they happened. WatchHealth blocks on out: the caller must keep
	// reading it until WatchHealth returns.
	WatchHealth(ctx context.Context, out chan<- HealthEvent) error
}

// HealthEventKind says what happened to a GPU.
type HealthEventKind string

const (
	// HealthXID is an XID error the driver reported (an NVML critical XID
	// event); [HealthEvent.XID] holds its number.
	HealthXID HealthEventKind = "xid"
	// HealthECCDoubleBit is an uncorrectable (double-bit) ECC error.
	HealthECCDoubleBit HealthEventKind = "ecc-dbe"
	// HealthGPULost is a GPU that fell off the bus or is otherwise
	// inaccessible: NVML answers its calls with NVML_ERROR_GPU_IS_LOST.
	HealthGPULost HealthEventKind = "gpu-lost"
	// HealthRecovered clears every earlier event of the GPU: the GPU
	// answers again and needs no recovery action (the reset or reboot the
	// driver asked for was done).
	HealthRecovered HealthEventKind = "recovered"
)

// HealthEventKinds lists the kinds.
var HealthEventKinds = []HealthEventKind{HealthXID, HealthECCDoubleBit, HealthGPULost, HealthRecovered}

// NoInstance is the GPU or compute instance ID of an event that concerns
// no MIG device in particular (NVML's 0xFFFFFFFF).
const NoInstance = -1

// HealthEvent is one change of a GPU's health.
type HealthEvent struct {
	// GPUUUID is the physical GPU concerned; for an event of a MIG device,
	// its parent.
	GPUUUID string
	Kind    HealthEventKind
	// XID is the XID number of a HealthXID event.
	XID uint64
	// GIID and CIID identify the MIG device (GPU and compute instance on
	// the parent) an event came from, or are [NoInstance] when it came
	// from the GPU as a whole.
	GIID, CIID int
	// Time is when the event was seen.
	Time time.Time
	// Detail says more, for logs and events (the NVML error, say); may be
	// empty.
	Detail string
}

// MIG reports whether the event came from one MIG device.
func (e HealthEvent) MIG() bool { return e.GIID != NoInstance }

// String renders the event for logs: "xid 79 on GPU-... (GI 1, CI 0)".
func (e HealthEvent) String() string {
	what := string(e.Kind)
	if e.Kind == HealthXID {
		what = fmt.Sprintf("xid %d", e.XID)
	}
	s := fmt.Sprintf("%s on %s", what, e.GPUUUID)
	if e.MIG() {
		s += fmt.Sprintf(" (GI %d, CI %d)", e.GIID, e.CIID)
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}
