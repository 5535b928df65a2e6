package imexchannel

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// Publisher is what the channel driver publishes: the node's channel and
// daemon devices (devicemodel.BuildComputeDomain). It implements
// [preparer.Publisher] and [preparer.FallbackProvider], and its Build is
// the driver's [preparer.ModelBuilder].
type Publisher struct {
	shared atomic.Bool
}

var (
	_ preparer.Publisher        = &Publisher{}
	_ preparer.FallbackProvider = &Publisher{}
)

// NewPublisher returns the publisher. shared publishes channel-0 for
// several claims at once (allowMultipleAllocations), so that several
// domains, and several pods of one domain, run on the node.
func NewPublisher(shared bool) *Publisher {
	p := &Publisher{}
	p.shared.Store(shared)
	return p
}

// Publish implements [preparer.Publisher]: only a node that can join an
// IMEX domain publishes channel and daemon devices (see
// [devicemodel.BuildComputeDomain]). Any other node publishes an empty
// pool, and the operator hears why: without IMEX channels in the GPU
// driver, without a GPU in a multi-node NVLink clique, or with GPUs that
// disagree about their clique or are not registered with the fabric. A
// node whose GPUs are still registering with the fabric (Fabric Manager
// starting at boot) waits: its notice is pending, names each GPU's state,
// and the devices are published at the first discovery that finds the
// registration completed.
func (p *Publisher) Publish(in *preparer.PublishInput) {
	if in.Inventory == nil || in.Inventory.Majors.IMEXChannels == 0 {
		in.Notices = append(in.Notices, preparer.Notice{
			Reason:  "IMEXChannelsUnavailable",
			Message: "no nvidia-caps-imex-channels in /proc/devices: the GPU driver offers no IMEX channels, so this node publishes no channel or daemon devices",
		})
		return
	}
	if waiting := registering(in.Inventory); len(waiting) > 0 {
		in.Notices = append(in.Notices, preparer.Notice{
			Reason: ReasonFabricPending,
			Message: fmt.Sprintf("no channel or daemon devices published yet: waiting for the GPUs' NVLink fabric registration to complete (Fabric Manager may still be starting): %s",
				strings.Join(waiting, ", ")),
			Expected: true,
			Pending:  true,
		})
		return
	}
	clique, err := in.Inventory.CliqueID()
	switch {
	case err != nil:
		in.Notices = append(in.Notices, preparer.Notice{Reason: "NVLinkCliqueUnknown", Message: "no channel or daemon devices published: NVLink clique: " + err.Error()})
	case clique == "":
		in.Notices = append(in.Notices, preparer.Notice{
			Reason:   "NoNVLinkFabric",
			Message:  fmt.Sprintf("no channel or daemon devices published: none of the node's %d GPUs is in a multi-node NVLink clique (no fabric cluster UUID), so the node cannot join a ComputeDomain", len(in.Inventory.GPUs)),
			Expected: true,
		})
	}
}

// ReasonFabricPending is the reason of the notice (and Node event) of a
// node that waits for its GPUs' NVLink fabric registration to complete.
const ReasonFabricPending = "NVLinkFabricPending"

// registering names the GPUs of inv whose fabric registration has not
// finished, with their state: "GPU 0 (GPU-...) InProgress".
func registering(inv *hardware.Inventory) []string {
	var out []string
	for _, g := range inv.GPUs {
		if g.Fabric.Registering() {
			out = append(out, fmt.Sprintf("GPU %d (%s) %s", g.Index, g.UUID, g.Fabric.State))
		}
	}
	return out
}

// Build builds the channel driver's devices. A node that cannot join a
// domain publishes none (Publish says why) rather than failing discovery.
func (p *Publisher) Build(inv *hardware.Inventory, _ ...devicemodel.Option) (*devicemodel.Model, error) {
	m, err := devicemodel.BuildComputeDomain(inv, devicemodel.ComputeDomainOptions{SharedChannel: p.shared.Load()})
	if err != nil {
		return devicemodel.BuildComputeDomain(nil, devicemodel.ComputeDomainOptions{})
	}
	return m, nil
}

// Fallbacks implements [preparer.FallbackProvider]: without
// allowMultipleAllocations in the API server, channel-0 is published for
// one claim at a time, as NVIDIA's driver does.
func (p *Publisher) Fallbacks() []preparer.Fallback {
	return []preparer.Fallback{{
		Feature: "DRAConsumableCapacity", On: &p.shared,
		Log:    "The API server lacks allowMultipleAllocations (DRAConsumableCapacity): publishing channel-0 for one claim at a time; one domain per node",
		Reason: "SharedChannelUnavailable",
		Event:  "The API server dropped allowMultipleAllocations of channel-0 (DRAConsumableCapacity off): gpudra publishes it for one claim at a time, so a node serves one ComputeDomain pod at a time",
	}}
}
