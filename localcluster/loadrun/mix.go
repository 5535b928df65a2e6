package loadrun

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpudra/gpudra/pkg/simfleet"
)

// Mix is what the load run's pods ask for (Options.Mix, --mix).
type Mix string

const (
	// MixGPU: every pod one whole GPU, on nodes of eight unshared H100s.
	MixGPU Mix = "gpu"
	// MixMixed: a third of the pods a dynamic MIG device (loadMIGProfile),
	// a tenth a share of a GPU, the rest a whole GPU, on nodes whose first
	// H100 has MIG mode on (gpudra offers its placements, created at
	// Prepare) and whose other seven are shared (--sharing unlimited).
	MixMixed Mix = "mixed"
)

// mixes are the values --mix accepts.
var mixes = []Mix{MixGPU, MixMixed}

// ParseMix returns the mix named s, or an error naming the flag and
// the values it accepts.
func ParseMix(s string) (Mix, error) {
	names := make([]string, len(mixes))
	for i, m := range mixes {
		if string(m) == s {
			return m, nil
		}
		names[i] = string(m)
	}
	return "", fmt.Errorf("--mix %q: must be one of %s", s, strings.Join(names, ", "))
}

// podKind is what one load pod's claim asks for.
type podKind string

const (
	// kindGPU is one whole GPU.
	kindGPU podKind = "gpu"
	// kindMIG is one dynamic MIG device of loadMIGProfile, which gpudra
	// creates at Prepare and destroys at Unprepare.
	kindMIG podKind = "mig"
	// kindShare is a share of a GPU: memory 0 of a GPU of a node with
	// --sharing unlimited, an uncapped share that any number of claims
	// may hold. Capped shares are left out: each would start an MPS
	// daemon, in the local cluster a process of the program running it
	// (gpudra-sim: 200 MB), whose
	// start would weigh more than the driver the run measures.
	kindShare podKind = "share"
)

// loadKindLabel is the label that says a load pod's kind.
const loadKindLabel = "gpudra-sim/load-kind"

// The mixed run's node layout: loadMIGGPUs MIG-mode H100s of
// loadMIGPerGPU loadMIGProfile placements each, and loadWholeGPUs shared
// H100s (TestMixedFleetLayout checks these against gpudra's device model
// of such a node).
const (
	loadMIGProfile = "1g.10gb"
	loadMIGGPUs    = 1
	loadMIGPerGPU  = 7
	loadWholeGPUs  = 7
	loadSharing    = "unlimited"
)

// kinds returns the kind of each of n pods. The mixed run has exactly n/3
// MIG pods and n/10 shares, spread evenly over the creation order, so
// that every part of a round has all kinds.
func (m Mix) kinds(n int) []podKind {
	out := make([]podKind, n)
	for i := range out {
		out[i] = kindGPU
	}
	if m != MixMixed || n == 0 {
		return out
	}
	mig, share := n/3, n/10
	for k := range mig {
		out[k*n/mig] = kindMIG // n/mig >= 3: distinct indices
	}
	for k := range share {
		// An even spacing of at least 10, or the index after it where a
		// MIG pod has it (MIG pods are at least 3 apart): never the next
		// share's.
		i := k * n / share
		for out[i] != kindGPU {
			i++
		}
		out[i] = kindShare
	}
	return out
}

// count returns how many of kinds are kind k.
func count(kinds []podKind, k podKind) int {
	c := 0
	for _, x := range kinds {
		if x == k {
			c++
		}
	}
	return c
}

// describe says what n pods of the mix ask for, for the report.
func (m Mix) describe(n int) string {
	if m != MixMixed {
		return "one-GPU claim templates"
	}
	k := m.kinds(n)
	return fmt.Sprintf("mixed claim templates: %d a %s dynamic MIG device, %d a share (memory 0, --sharing %s), %d a whole GPU",
		count(k, kindMIG), loadMIGProfile, count(k, kindShare), loadSharing, count(k, kindGPU))
}

// fits returns an error, naming --pods, when n pods of the mix cannot all
// run at once on nodes nodes. It does not count on shares of memory 0
// fitting beside a GPU held whole: each may take a GPU of its own.
func (m Mix) fits(n, nodes int) error {
	if m != MixMixed {
		if gpus := 8 * nodes; n > gpus {
			return fmt.Errorf("--pods %d is more than the %d GPUs of %d nodes", n, gpus, nodes)
		}
		return nil
	}
	k := m.kinds(n)
	if mig, room := count(k, kindMIG), loadMIGGPUs*loadMIGPerGPU*nodes; mig > room {
		return fmt.Errorf("--pods %d with --mix %s: %d MIG pods is more than the %d %s placements of %d nodes", n, m, mig, room, loadMIGProfile, nodes)
	}
	if whole, room := count(k, kindGPU)+count(k, kindShare), loadWholeGPUs*nodes; whole > room {
		return fmt.Errorf("--pods %d with --mix %s: %d whole-GPU and share pods is more than the %d non-MIG GPUs of %d nodes", n, m, whole, room, nodes)
	}
	return nil
}

// fleet describes n nodes of eight H100s each, laid out for the mix, their
// plugins in MIG mode migMode (Options.MIGMode).
func (m Mix) fleet(n int, migMode string) (*simfleet.Fleet, error) {
	var b strings.Builder
	b.WriteString("nodes:\n")
	for i := range n {
		fmt.Fprintf(&b, "- name: node-%03d\n", i)
		switch migMode {
		case MIGModeDynamic:
			b.WriteString("  migMode: dynamic\n  migModeSwitching: true\n")
		case MIGModeStatic:
			b.WriteString("  migMode: static\n")
		}
		gpus := 8
		if m == MixMixed {
			fmt.Fprintf(&b, "  sharing: %s\n", loadSharing)
		}
		b.WriteString("  gpus:\n")
		if m == MixMixed {
			for range loadMIGGPUs {
				b.WriteString("  - model: H100-SXM5-80GB\n    migEnabled: true\n")
			}
			gpus = loadWholeGPUs
		}
		for range gpus {
			b.WriteString("  - model: H100-SXM5-80GB\n")
		}
	}
	return simfleet.Parse([]byte(b.String()), "load fleet")
}

// loadRequest is the device request of a load pod's claim of the given
// kind, served by a driver whose whole GPUs are of DeviceClass gpuClass
// and MIG devices of migClass (attribute domain driver).
func loadRequest(kind podKind, driver, gpuClass, migClass string) resourceapi.DeviceRequest {
	switch kind {
	case kindMIG:
		return resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: migClass,
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
				Expression: fmt.Sprintf("device.attributes['%s'].profile == '%s'", driver, loadMIGProfile),
			}}},
		}}
	case kindShare:
		return resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: gpuClass,
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
				"memory": resource.MustParse("0"),
			}},
		}}
	default:
		return resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: gpuClass}}
	}
}
