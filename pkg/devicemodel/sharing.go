package devicemodel

import (
	"fmt"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// Capacities a shareable GPU publishes besides memory (see [WithSharing]).
const (
	// CapCompute is the percent of the GPU's SMs a share may use, 0 to
	// 100; 0 leaves the share's compute uncapped.
	CapCompute resourceapi.QualifiedName = "compute"
	// CapShares is the number of equal shares a GPU is cut into, under the
	// name NVIDIA's DRA driver publishes it, so that its manifests work.
	CapShares resourceapi.QualifiedName = "shares"
)

// SharingMode is how a node's full GPUs are shared between claims.
type SharingMode string

const (
	// SharingNone publishes every full GPU for one claim at a time.
	SharingNone SharingMode = "none"
	// SharingMemoryCompute lets claims ask for part of a GPU's memory (in
	// bytes) and of its SMs (in percent).
	SharingMemoryCompute SharingMode = "memory-compute"
	// SharingShares cuts each GPU into N equal shares.
	SharingShares SharingMode = "shares"
	// SharingUnlimited lets any number of claims share a GPU.
	SharingUnlimited SharingMode = "unlimited"
)

// MaxShares is the most equal shares a GPU may be cut into: one share's
// compute cap, 100/N percent of the SMs, must be at least 1.
const MaxShares = 100

// sharingSyntax lists the accepted spellings, for errors and help texts.
const sharingSyntax = "none, memory-compute, shares=<N> (N from 1 to 100) or unlimited"

// minShareMemory is the least memory a memory-compute share takes, and
// the least pinned memory limit an MPS daemon accepts.
const minShareMemory = 1 << 20

// Sharing is how a node's full GPUs are shared (KEP-5075 consumable
// capacity). The zero value shares nothing. It is a flag value:
// *Sharing implements pflag.Value.
type Sharing struct {
	// Mode is the kind of sharing; "" is [SharingNone].
	Mode SharingMode
	// Shares is N for [SharingShares], 0 otherwise.
	Shares int
	// ShareByDefault gives a claim that asks for no capacity one share in
	// [SharingShares] and none (no caps) in [SharingUnlimited], as NVIDIA's
	// driver does, instead of the whole GPU. It is not part of String: the
	// --sharing-default flag sets it.
	ShareByDefault bool
}

// Values of --sharing-default: what a claim that asks for no capacity gets
// on a shared GPU.
const (
	// SharingDefaultWhole gives it the whole GPU, uncapped (the default).
	SharingDefaultWhole = "whole"
	// SharingDefaultShare gives it one share (shares=<N>) or nothing
	// (unlimited), as NVIDIA's driver does.
	SharingDefaultShare = "share"
)

// ParseSharingDefault reads --sharing-default: whether a claim that asks
// for no capacity gets a share rather than the whole GPU.
func ParseSharingDefault(v string) (shareByDefault bool, err error) {
	switch v {
	case SharingDefaultWhole:
		return false, nil
	case SharingDefaultShare:
		return true, nil
	}
	return false, fmt.Errorf("sharing default %q: must be %s or %s", v, SharingDefaultWhole, SharingDefaultShare)
}

// ParseSharing reads a sharing setting as the --sharing flag and the
// simulated fleets' sharing field spell it: "none", "memory-compute",
// "shares=<N>" or "unlimited".
func ParseSharing(v string) (Sharing, error) {
	switch v {
	case string(SharingNone):
		return Sharing{Mode: SharingNone}, nil
	case string(SharingMemoryCompute):
		return Sharing{Mode: SharingMemoryCompute}, nil
	case string(SharingUnlimited):
		return Sharing{Mode: SharingUnlimited}, nil
	}
	n, ok := strings.CutPrefix(v, string(SharingShares)+"=")
	if !ok {
		return Sharing{}, fmt.Errorf("sharing %q: must be %s", v, sharingSyntax)
	}
	shares, err := strconv.Atoi(n)
	if err != nil || strconv.Itoa(shares) != n {
		return Sharing{}, fmt.Errorf("sharing %q: the number of shares %q is not a whole number; must be %s", v, n, sharingSyntax)
	}
	s := Sharing{Mode: SharingShares, Shares: shares}
	return s, s.Validate()
}

// ParseConsumableShares reads NVIDIA's --consumable-shares values, so that
// its DaemonSet arguments carry over: "disabled" is none, "memory" is
// memory-compute (NVIDIA's memory mode plus a compute capacity, which a
// claim need not ask for), a positive integer N is shares=N, "unlimited" is
// unlimited. The defaults stay gpudra's (see [WithSharing]): a claim that
// asks for nothing gets the whole GPU unless ShareByDefault is set.
func ParseConsumableShares(v string) (Sharing, error) {
	switch v {
	case "disabled":
		return Sharing{Mode: SharingNone}, nil
	case "memory":
		return Sharing{Mode: SharingMemoryCompute}, nil
	case string(SharingUnlimited):
		return Sharing{Mode: SharingUnlimited}, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || strconv.Itoa(n) != v {
		return Sharing{}, fmt.Errorf("consumable shares %q: must be disabled, memory, unlimited or a whole number of shares from 1 to %d", v, MaxShares)
	}
	s := Sharing{Mode: SharingShares, Shares: n}
	if err := s.Validate(); err != nil {
		return Sharing{}, fmt.Errorf("consumable shares %q: the number of shares must be from 1 to %d", v, MaxShares)
	}
	return s, nil
}

// Validate reports what is wrong with a Sharing made in code.
func (s Sharing) Validate() error {
	switch s.Mode {
	case "", SharingNone, SharingMemoryCompute, SharingUnlimited:
		if s.Shares != 0 {
			return fmt.Errorf("sharing %s: shares %d: only shares=<N> takes a number of shares", s.mode(), s.Shares)
		}
	case SharingShares:
		if s.Shares < 1 || s.Shares > MaxShares {
			return fmt.Errorf("sharing shares=%d: the number of shares must be from 1 to %d", s.Shares, MaxShares)
		}
	default:
		return fmt.Errorf("sharing mode %q: must be %s", s.Mode, sharingSyntax)
	}
	return nil
}

// Enabled reports whether full GPUs are shared at all.
func (s Sharing) Enabled() bool { return s.mode() != SharingNone }

func (s Sharing) mode() SharingMode {
	if s.Mode == "" {
		return SharingNone
	}
	return s.Mode
}

// String returns the setting as [ParseSharing] reads it.
func (s Sharing) String() string {
	if s.Mode == SharingShares {
		return fmt.Sprintf("%s=%d", SharingShares, s.Shares)
	}
	return string(s.mode())
}

// Set implements pflag.Value.
func (s *Sharing) Set(v string) error {
	parsed, err := ParseSharing(v)
	if err != nil {
		return err
	}
	*s = parsed
	return nil
}

// Type implements pflag.Value.
func (s *Sharing) Type() string { return "sharing" }

// WithSharing publishes the full GPUs of the node as shareable devices
// (KEP-5075): allowMultipleAllocations, with consumable capacities whose
// request policies say what one share takes. Device names and attributes
// stay those of the full GPU, so CEL selectors keep working.
//
//   - memory-compute: memory (bytes) from 1Mi to all of it in steps of one
//     byte, defaulting to all of it, and compute (percent of SMs) from 0
//     to 100, defaulting to 0 (uncapped).
//   - shares=N: shares N, from 1 to N, defaulting to N; memory may not be
//     asked for (only 0), so a claim asking for memory lands on a node
//     that shares by memory.
//   - unlimited: memory from 0 to all of it, defaulting to all of it; any
//     number of claims that ask for memory 0 fit.
//
// So a claim that asks for no capacity holds the whole GPU, uncapped, in
// every mode: a claim written for "a GPU" never gets less on a shared node.
// With s.ShareByDefault, as in NVIDIA's driver, it gets one share
// (shares=N) or nothing (unlimited) instead. Every shared GPU carries the
// attribute sharingMode (the mode's name; unshared full GPUs say "none"),
// so that CEL can choose or avoid a mode.
//
// Which GPUs are shared: a GPU offered whole (MIG mode off, or mode
// switching with [WithMIGModeSwitching]) is shared; a GPU in MIG mode that
// stays so publishes its MIG devices, never shared, and a GPU offered only
// for passthrough ([VFIOOnly]) is not shared. A shared GPU that also has
// MIG placements or a VFIO device keeps consuming its whole counter set;
// the scheduler charges a shared device's counters once, while any share
// of it is allocated, so a share, a MIG device and the VFIO device of one
// GPU never coexist.
func WithSharing(s Sharing) Option {
	return func(o *buildOptions) { o.sharing = s }
}

// shareFullGPU makes the published full GPU of gpu shareable as s says.
func (m *Model) shareFullGPU(gpu *hardware.GPU, s Sharing) error {
	i, ok := m.byName[GPUName(gpu.Minor)]
	if !ok || m.Devices[i].Kind != KindGPU {
		return fmt.Errorf("GPU %d (%s): sharing: the full GPU %s is not published", gpu.Index, gpu.UUID, GPUName(gpu.Minor))
	}
	if gpu.MemoryBytes < 2*minShareMemory {
		return fmt.Errorf("GPU %d (%s): sharing %s: %d bytes of memory are too few to share, at least %d are needed", gpu.Index, gpu.UUID, s, gpu.MemoryBytes, 2*minShareMemory)
	}
	d := &m.Devices[i]
	d.Sharing = s
	d.API.AllowMultipleAllocations = ptr.To(true)
	memory := bytesCapacity(gpu.MemoryBytes)
	switch s.Mode {
	case SharingMemoryCompute:
		// Steps of a byte, not of 1Mi: a quarter of an H100's 81559Mi is
		// no whole MiB, and four quarters must fit.
		memory.RequestPolicy = rangePolicy(memory.Value, resource.MustParse("1Mi"), memory.Value, resource.MustParse("1"))
		d.API.Capacity[CapCompute] = resourceapi.DeviceCapacity{
			Value:         percent(100),
			RequestPolicy: rangePolicy(percent(0), percent(0), percent(100), percent(1)),
		}
	case SharingShares:
		zero := *resource.NewQuantity(0, resource.BinarySI)
		memory.RequestPolicy = &resourceapi.CapacityRequestPolicy{Default: &zero, ValidValues: []resource.Quantity{zero}}
		d.API.Capacity[CapShares] = sharesCapacity(s.Shares, s.ShareByDefault)
	case SharingUnlimited:
		zero := *resource.NewQuantity(0, resource.BinarySI)
		def := memory.Value
		if s.ShareByDefault {
			def = zero
		}
		memory.RequestPolicy = rangePolicy(def, zero, memory.Value, resource.MustParse("1"))
	}
	d.API.Capacity[CapMemory] = memory
	d.API.Attributes[AttrSharingMode] = resourceapi.DeviceAttribute{StringValue: ptr.To(string(s.mode()))}
	return nil
}

// sharesCapacity is the capacity of n equal shares: by default all of
// them (the whole GPU), with oneByDefault one. The API wants min+step
// within the value, so a single share has no step.
func sharesCapacity(n int, oneByDefault bool) resourceapi.DeviceCapacity {
	c := countCapacity(n)
	one := countCapacity(1).Value
	def := c.Value
	if oneByDefault {
		def = one
	}
	c.RequestPolicy = rangePolicy(def, one, c.Value, one)
	if n == 1 {
		c.RequestPolicy.ValidRange.Step = nil
	}
	return c
}

// rangePolicy is a request policy over [minimum, maximum] in steps of
// step from minimum.
func rangePolicy(def, minimum, maximum, step resource.Quantity) *resourceapi.CapacityRequestPolicy {
	return &resourceapi.CapacityRequestPolicy{
		Default:    &def,
		ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: &minimum, Max: &maximum, Step: &step},
	}
}

func percent(n int64) resource.Quantity { return *resource.NewQuantity(n, resource.DecimalSI) }
