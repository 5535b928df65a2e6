package devicemodel

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// The device kinds of driver compute-domain.nvidia.com.
const (
	// KindChannel is an IMEX channel handle: the device a pod of a
	// ComputeDomain is allocated; Prepare gives its containers the
	// domain's channel.
	KindChannel Kind = "channel"
	// KindDaemon is the node's IMEX daemon device.
	KindDaemon Kind = "daemon"
)

// AttrID is the "id" attribute of channel and daemon devices (int), and
// AttrCliqueID gpudra's "cliqueID" (string, "<cluster UUID>.<clique ID>")
// on both (only nodes in an NVLink clique publish them); NVIDIA's driver labels the
// node with its clique instead (nvidia.com/gpu.clique), which CEL cannot
// read.
const (
	AttrID       resourceapi.QualifiedName = "id"
	AttrCliqueID resourceapi.QualifiedName = "cliqueID"
)

// ChannelName and DaemonName are the names of the devices with the given
// id, as NVIDIA's driver names them.
func ChannelName(id int) string { return fmt.Sprintf("channel-%d", id) }

// DaemonName returns the name of the daemon device with the given id.
func DaemonName(id int) string { return fmt.Sprintf("daemon-%d", id) }

// ComputeDomainOptions shape [BuildComputeDomain].
type ComputeDomainOptions struct {
	// SharedChannel publishes channel-0 for several claims at once
	// (allowMultipleAllocations, KEP-5075), so that pods of more than one
	// domain, and more than one pod of a domain, can run on the node: each
	// domain still gets a channel of its own at Prepare. Without it,
	// channel-0 goes to one claim at a time, as with NVIDIA's driver.
	SharedChannel bool
}

// BuildComputeDomain derives the devices of driver
// compute-domain.nvidia.com on a node: channel-0, which NVIDIA's
// compute-domain-default-channel.nvidia.com class selects, and daemon-0,
// both carrying the node's clique from [hardware.Inventory.CliqueID].
//
// Only a node that can join an IMEX domain publishes them: a node with no
// IMEX channel major (a driver without IMEX) or with no GPU in a
// multi-node NVLink clique (no fabric, or a fabric without a cluster UUID,
// such as a single HGX board) publishes nothing, since a channel allocated
// there could never be prepared. A node whose GPUs disagree about their
// clique, or whose fabric registration is unfinished or failed, publishes
// nothing and the error says why.
func BuildComputeDomain(inv *hardware.Inventory, o ComputeDomainOptions) (*Model, error) {
	m := &Model{byName: map[string]int{}}
	if inv == nil || inv.Majors.IMEXChannels == 0 {
		return m, nil
	}
	clique, err := inv.CliqueID()
	if err != nil {
		return m, fmt.Errorf("NVLink clique: %w", err)
	}
	if clique == "" {
		return m, nil
	}
	attrs := func(kind Kind) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
		return map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			AttrType:     {StringValue: ptr.To(string(kind))},
			AttrID:       {IntValue: ptr.To(int64(0))},
			AttrCliqueID: {StringValue: ptr.To(clique)},
		}
	}
	channel := Device{Kind: KindChannel, API: resourceapi.Device{Name: ChannelName(0), Attributes: attrs(KindChannel)}}
	if o.SharedChannel {
		channel.API.AllowMultipleAllocations = ptr.To(true)
	}
	daemon := Device{Kind: KindDaemon, API: resourceapi.Device{Name: DaemonName(0), Attributes: attrs(KindDaemon)}}
	for _, d := range []Device{channel, daemon} {
		if err := m.add(d); err != nil {
			return nil, err
		}
	}
	return m, nil
}
