package sim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/nvmlhw"
)

// Majors of a simulated node's device nodes. NVIDIA's is fixed by the
// driver; the others are the values real nodes commonly show.
const (
	UVMMajor  = 509
	CapsMajor = 510
	// IMEXChannelsMajor is the major of
	// /dev/nvidia-caps-imex-channels/channel<N>; real nodes show their
	// own in /proc/devices (nvidia-caps-imex-channels).
	IMEXChannelsMajor = 511
)

// Hardware returns the node's GPUs as [hardware.Hardware]: NVML discovery
// (package nvmlhw) over a fake NVML built from the node, with the node's
// PCIe topology, the majors nvidia 195, nvidia-uvm [UVMMajor] and
// nvidia-caps [CapsMajor], and the driver's standard MIG capability minors
// (see [nvmlhw.StandardMIGCapMinors]).
//
// The result also implements [hardware.MIGManager],
// [hardware.MIGModeSwitcher] and [hardware.HealthWatcher] (see
// [WithHealthEvents]), through nvmlhw's code over the same fake:
// MIG devices created or destroyed, and MIG modes switched, are what later
// Discover calls see. Each call of Hardware starts from the node's
// description, or from the state file [WithStateFile] names; the node
// itself never changes.
//
// The result is safe for concurrent use. A node that did not go through
// [Resolve] is resolved first; if that fails, every method reports why.
func (n *Node) Hardware(opts ...HardwareOption) hardware.Hardware {
	c := n.clone()
	p := &problems{where: fmt.Sprintf("simulated node %q: ", n.Name)}
	c.resolve(p)
	if err := errors.Join(p.errs...); err != nil {
		return brokenHardware{err: err}
	}
	nv := newFakeNVML(c, opts...)
	if err := nv.loadState(); err != nil {
		return brokenHardware{err: fmt.Errorf("simulated node %q: %w", n.Name, err)}
	}
	return nvmlhw.NewFromInterface(nv, newTopology(c), systemInfo{}, nvmlhw.WithHealthPolling(HealthPollInterval, HealthWaitTimeout))
}

// The health watcher's timing over simulated GPUs. The simulated event set
// blocks as nvmlEventSetWait does, and every injected change wakes it (an
// XID or ECC event, a lost GPU failing the wait, a recovery raising a
// recovery-action event); it can also be interrupted, so an idle
// watcher waits on it without a timeout and does no periodic work.
// HealthPollInterval is left for what only time tells: a fault whose
// recovery action never read anything but none is recovered one interval
// after it, and GPUs that cannot raise events (armed faults) are polled
// at it. The wait timeout is only the pause after a failed wait.
const (
	HealthPollInterval = time.Second
	HealthWaitTimeout  = 50 * time.Millisecond
)

var _ nvmlhw.InterruptibleEventSet = (*fakeEventSet)(nil)

// HardwareOption configures the simulated hardware of [Node.Hardware].
type HardwareOption func(*hardwareOptions)

type hardwareOptions struct {
	faults            *Faults
	health            *HealthEvents
	minorsAfterSwitch map[string]int
	stateFile         string
}

// WithFaults makes the hardware's NVML calls fail as f says, and count in
// f.
func WithFaults(f *Faults) HardwareOption {
	return func(o *hardwareOptions) { o.faults = f }
}

// WithMinorAfterMIGModeSwitch makes the GPU with the given UUID come back
// with device minor minor after its MIG mode switches (on Hopper and newer,
// which switch at once): nvmlDeviceSetMigMode may reset the GPU, and NVML
// tells callers to read such attributes again. Without it the minor stays.
// The simulation does not check that the new minor is free.
func WithMinorAfterMIGModeSwitch(gpuUUID string, minor int) HardwareOption {
	return func(o *hardwareOptions) {
		if o.minorsAfterSwitch == nil {
			o.minorsAfterSwitch = map[string]int{}
		}
		o.minorsAfterSwitch[gpuUUID] = minor
	}
}

// clone copies the node deeply enough that resolving the copy leaves n
// alone.
func (n *Node) clone() *Node {
	c := *n
	c.GPUs = slices.Clone(n.GPUs)
	if n.Fabric != nil {
		f := *n.Fabric
		c.Fabric = &f
	}
	if n.Topology != nil {
		t := *n.Topology
		c.Topology = &t
	}
	c.NVMLErrors = maps.Clone(n.NVMLErrors)
	for i := range c.GPUs {
		c.GPUs[i].MIGDevices = slices.Clone(c.GPUs[i].MIGDevices)
		c.GPUs[i].NVMLErrors = maps.Clone(c.GPUs[i].NVMLErrors)
	}
	return &c
}

// brokenHardware is the hardware of a node that does not validate. Every
// method returns why.
type brokenHardware struct{ err error }

var (
	_ hardware.MIGManager      = brokenHardware{}
	_ hardware.MIGModeSwitcher = brokenHardware{}
)

// Discover implements [hardware.Hardware].
func (b brokenHardware) Discover(context.Context) (*hardware.Inventory, error) { return nil, b.err }

// CreateMIGDevice implements [hardware.MIGManager].
func (b brokenHardware) CreateMIGDevice(context.Context, hardware.MIGPlacement) (hardware.MIGDevice, error) {
	return hardware.MIGDevice{}, b.err
}

// DestroyMIGDevice implements [hardware.MIGManager].
func (b brokenHardware) DestroyMIGDevice(context.Context, hardware.MIGPlacement) error { return b.err }

// SetMIGMode implements [hardware.MIGModeSwitcher].
func (b brokenHardware) SetMIGMode(context.Context, string, bool) error { return b.err }

// topology implements [nvmlhw.Topology] from the fleet description.
type topology map[string]topologyEntry

type topologyEntry struct {
	// root is "" for a device sysfs has no record of, TopologyUnknown for
	// one whose root cannot be read.
	root string
	numa *int
}

func newTopology(n *Node) topology {
	t := topology{}
	for _, g := range n.GPUs {
		e := topologyEntry{root: g.PCIeRoot}
		if g.NUMANode != nil && *g.NUMANode >= 0 {
			numa := *g.NUMANode
			e.numa = &numa
		}
		t[g.PCIBusID] = e
	}
	return t
}

// PCIeRoot implements [nvmlhw.Topology].
func (t topology) PCIeRoot(pciBusID string) (string, error) {
	root := t[pciBusID].root
	if root == TopologyUnknown {
		return "", errUnknownPCIeRoot
	}
	return root, nil
}

// NUMANode implements [nvmlhw.Topology].
func (t topology) NUMANode(pciBusID string) (*int, error) {
	numa := t[pciBusID].numa
	if numa == nil {
		return nil, nil
	}
	v := *numa // callers own what they get
	return &v, nil
}

// systemInfo implements [nvmlhw.SystemInfo] for every simulated node.
type systemInfo struct{}

// standardCaps is built once and only read afterwards.
var standardCaps = sync.OnceValue(nvmlhw.StandardMIGCapMinors)

// Majors implements [nvmlhw.SystemInfo].
func (systemInfo) Majors() (hardware.Majors, error) {
	return hardware.Majors{NVIDIA: nvmlhw.NVIDIAMajor, UVM: UVMMajor, Caps: CapsMajor, IMEXChannels: IMEXChannelsMajor}, nil
}

// MIGCapMinors implements [nvmlhw.SystemInfo].
func (systemInfo) MIGCapMinors() (nvmlhw.MIGCapMinors, error) { return standardCaps(), nil }
