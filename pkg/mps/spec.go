package mps

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
)

// MaxIDLength bounds a daemon ID. IDs name a directory and, with the systemd
// launcher, a unit; a claim UID (36 characters) plus a share ID fits easily.
const MaxIDLength = 128

// MiB is the unit the control daemon takes pinned memory limits in.
const MiB = 1 << 20

// ErrInvalidSpec is wrapped by every error about a Spec or an ID that can
// never succeed: the caller must change its input, retrying does not help.
var ErrInvalidSpec = errors.New("invalid MPS daemon spec")

// Spec is what one control daemon is started with. It is immutable for the
// daemon's life: a different Spec for the same ID is refused until the
// daemon is stopped.
type Spec struct {
	// ID names the daemon and its directories: the claim UID, or the claim
	// UID and the share ID for one share of a fractional GPU. Letters,
	// digits, '.', '_' and '-' only, not starting with '.' or '-'.
	ID string `json:"id"`
	// DeviceUUIDs are the GPUs or MIG devices the daemon serves, in the
	// order clients enumerate them (the daemon's CUDA_VISIBLE_DEVICES).
	DeviceUUIDs []string `json:"deviceUUIDs"`
	// ActiveThreadPercentage caps the share of each device's SMs a client
	// of this daemon may use, 1 to 100. Nil leaves the daemon's default
	// (100). A cap, not a reservation.
	ActiveThreadPercentage *int `json:"activeThreadPercentage,omitempty"`
	// PinnedMemoryLimits caps the device memory a client may pin, in bytes,
	// per device UUID (each a key of DeviceUUIDs). The daemon takes whole
	// MiB: a value is rounded down to a multiple of 1 MiB, so the cap never
	// grows. Devices without an entry are not limited.
	PinnedMemoryLimits map[string]int64 `json:"pinnedMemoryLimits,omitempty"`
	// MultiUser starts the daemon with -M, so that clients running under
	// different user IDs share one server instead of waiting for each
	// other's server to go away.
	MultiUser bool `json:"multiUser,omitempty"`
}

var (
	idPattern = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]*$`)
	// Device UUIDs reach the control daemon inside text commands: no
	// whitespace, commas or '=' may ever be in them. The old MIG form
	// (MIG-GPU-<uuid>/<gi>/<ci>) has slashes.
	uuidPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9/_.:-]*$`)
)

// ValidateID reports whether id can name a daemon. It refuses what could
// escape the root directory or confuse a command line.
func ValidateID(id string) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: ID is empty", ErrInvalidSpec)
	case len(id) > MaxIDLength:
		return fmt.Errorf("%w: ID %.32q... is %d characters long, at most %d allowed", ErrInvalidSpec, id, len(id), MaxIDLength)
	case !idPattern.MatchString(id):
		return fmt.Errorf("%w: ID %q: only letters, digits, '.', '_' and '-' are allowed, and it must not start with '.' or '-'", ErrInvalidSpec, id)
	}
	return nil
}

// Validate reports the first problem of s, naming the field.
func (s Spec) Validate() error {
	if err := ValidateID(s.ID); err != nil {
		return err
	}
	if len(s.DeviceUUIDs) == 0 {
		return fmt.Errorf("%w: daemon %s: deviceUUIDs is empty; a daemon serves at least one device", ErrInvalidSpec, s.ID)
	}
	seen := make(map[string]bool, len(s.DeviceUUIDs))
	for i, u := range s.DeviceUUIDs {
		if !uuidPattern.MatchString(u) {
			return fmt.Errorf("%w: daemon %s: deviceUUIDs[%d] %q is not a device UUID (letters, digits, '-', '_', '.', ':', '/')", ErrInvalidSpec, s.ID, i, u)
		}
		if seen[u] {
			return fmt.Errorf("%w: daemon %s: deviceUUIDs[%d] %q appears twice", ErrInvalidSpec, s.ID, i, u)
		}
		seen[u] = true
	}
	if p := s.ActiveThreadPercentage; p != nil && (*p < 1 || *p > 100) {
		return fmt.Errorf("%w: daemon %s: activeThreadPercentage %d: must be 1 to 100", ErrInvalidSpec, s.ID, *p)
	}
	for _, u := range slices.Sorted(maps.Keys(s.PinnedMemoryLimits)) {
		if !seen[u] {
			return fmt.Errorf("%w: daemon %s: pinnedMemoryLimits[%q]: not one of deviceUUIDs %v", ErrInvalidSpec, s.ID, u, s.DeviceUUIDs)
		}
		if b := s.PinnedMemoryLimits[u]; b < MiB {
			return fmt.Errorf("%w: daemon %s: pinnedMemoryLimits[%q] %d bytes: must be at least 1 MiB (%d bytes)", ErrInvalidSpec, s.ID, u, b, MiB)
		}
	}
	return nil
}

// Equal reports whether s and o start the same daemon. A nil and an empty
// limit map are the same.
func (s Spec) Equal(o Spec) bool {
	samePct := (s.ActiveThreadPercentage == nil) == (o.ActiveThreadPercentage == nil) &&
		(s.ActiveThreadPercentage == nil || *s.ActiveThreadPercentage == *o.ActiveThreadPercentage)
	return s.ID == o.ID && s.MultiUser == o.MultiUser && samePct &&
		slices.Equal(s.DeviceUUIDs, o.DeviceUUIDs) && maps.Equal(s.PinnedMemoryLimits, o.PinnedMemoryLimits)
}

// clone returns a copy of s that shares no memory with it.
func (s Spec) clone() Spec {
	c := s
	c.DeviceUUIDs = slices.Clone(s.DeviceUUIDs)
	c.PinnedMemoryLimits = maps.Clone(s.PinnedMemoryLimits)
	if s.ActiveThreadPercentage != nil {
		p := *s.ActiveThreadPercentage
		c.ActiveThreadPercentage = &p
	}
	return c
}

// memLimitArg is a pinned memory limit as the control daemon takes it: an
// integer with the qualifier M. Rounding down keeps the cap a cap.
func memLimitArg(bytes int64) string {
	return strconv.FormatInt(bytes/MiB, 10) + "M"
}
