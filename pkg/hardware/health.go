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

// HealthChecker is implemented by hardware that can say, once, what
// condition each GPU is in now: what `gpudra inspect` shows. It is
// optional, like [HealthWatcher].
type HealthChecker interface {
	// CheckHealth reads every GPU's condition. It returns an error when
	// it cannot read any (no management library); a GPU it cannot read
	// at all is in the result with Err set.
	CheckHealth(ctx context.Context) ([]GPUCondition, error)
}

// RecoveryAction is what the driver says a GPU needs before it can be
// used again (NVML's NVML_FI_DEV_GET_GPU_RECOVERY_ACTION).
type RecoveryAction string

const (
	RecoveryNone              RecoveryAction = "none"
	RecoveryGPUReset          RecoveryAction = "gpu-reset"
	RecoveryNodeReboot        RecoveryAction = "node-reboot"
	RecoveryDrainP2P          RecoveryAction = "drain-p2p"
	RecoveryDrainAndReset     RecoveryAction = "drain-and-reset"
	RecoveryRecoverIMEXDomain RecoveryAction = "recover-imex-domain"
	// RecoveryUnreported: the driver does not report recovery actions
	// (drivers before R570), so a GPU that needs one cannot be told from
	// a healthy one.
	RecoveryUnreported RecoveryAction = "unreported"
)

// GPUCondition is one GPU's condition as [HealthChecker] read it.
type GPUCondition struct {
	// Index is the GPU's NVML index; UUID is empty when it could not be
	// read (a GPU lost before its UUID was read).
	Index int
	UUID  string
	// Lost: NVML answers the GPU's calls with NVML_ERROR_GPU_IS_LOST.
	Lost bool
	// Recovery is what the GPU needs; empty when Lost or Err.
	Recovery RecoveryAction
	// Err says why the GPU's condition could not be read (not lost).
	Err string
}

// Healthy reports whether the condition shows nothing wrong: readable,
// not lost, and no recovery action pending (or none reported).
func (c GPUCondition) Healthy() bool {
	return !c.Lost && c.Err == "" && (c.Recovery == RecoveryNone || c.Recovery == RecoveryUnreported)
}

// String is the condition in one word or two, as inspect's HEALTH column
// shows it: "ok", "lost", "needs gpu-reset", "unknown".
func (c GPUCondition) String() string {
	switch {
	case c.Lost:
		return "lost"
	case c.Err != "":
		return "unknown"
	case c.Recovery == RecoveryNone || c.Recovery == RecoveryUnreported:
		return "ok"
	}
	return "needs " + string(c.Recovery)
}
