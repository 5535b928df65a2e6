package preparer

import (
	"fmt"
	"sync/atomic"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// Publisher is implemented by features that shape what the node publishes:
// device-model options, GPUs left out or kept. Publish must be pure: it
// reads its input and its own settings only.
type Publisher interface {
	Publish(in *PublishInput)
}

// PublishInput is what publishers read and add to.
type PublishInput struct {
	// Inventory is what discovery found; a publisher may replace it (never
	// modify it) to leave GPUs out or keep some in.
	Inventory *hardware.Inventory
	// Previous is the inventory of the last publication, nil at first.
	Previous *hardware.Inventory
	// State is the prepared-claim state; nil when the checkpoint cannot be
	// read.
	State *claimstate.State
	// Options are the device-model options.
	Options []devicemodel.Option
	// Notices are conditions an operator should hear about.
	Notices []Notice
}

// EventComponent is the source component of the events gpudra's kubelet
// plugins record: `gpudra explain` shows a node's Warning events of it as
// what the node's publication left out or changed.
const EventComponent = "gpudra-kubelet-plugin"

// Notice is something a publication left out or changed that an operator
// should hear about. A problem is logged as an error at every publication
// and recorded as a Warning Node event when it appears; an expected
// absence is logged at Info when it appears (V(2) while it lasts) and
// recorded as a Normal event.
type Notice struct {
	Reason  string
	Message string
	// Expected marks an absence the node's hardware implies, not a
	// problem: a node without a multi-node NVLink fabric (every H100 node)
	// cannot join a ComputeDomain, and a cluster of such nodes should not
	// see an error for each of them every discovery interval.
	Expected bool
	// Pending marks an absence that ends by itself soon, such as an NVLink
	// fabric whose registration is still in progress at boot: while a
	// publication has a pending notice, the plugin discovers again every
	// few seconds instead of at its discovery interval, so the devices are
	// published promptly once the wait is over.
	Pending bool
}

// HasPending reports whether any of notices is [Notice].Pending.
func HasPending(notices []Notice) bool {
	for _, n := range notices {
		if n.Pending {
			return true
		}
	}
	return false
}

// Fallback is a publishing choice that needs an API feature: when the API
// server drops the feature's fields, the choice is turned off (On) and the
// devices are published without it, with a log line and a Node event.
// Half-published devices would be worse than none: a device whose shared
// counters or consumable capacity the API server dropped would be handed
// out more often than the hardware allows.
type Fallback struct {
	// Feature is the API server's feature gate, as DroppedFieldsError
	// names it.
	Feature       string
	On            *atomic.Bool
	Log           string
	Reason, Event string
}

// FallbackProvider is implemented by publishers with fallbacks.
type FallbackProvider interface {
	Fallbacks() []Fallback
}

// ModelBuilder builds a driver's device model from the node's inventory
// and the publishers' options: devicemodel.Build for the GPU driver,
// devicemodel.BuildComputeDomain's wrapper for the channel driver.
type ModelBuilder func(inv *hardware.Inventory, opts ...devicemodel.Option) (*devicemodel.Model, error)

// Published is one publication: the inventory the devices were built from
// and the devices.
type Published struct {
	Inventory *hardware.Inventory
	Model     *devicemodel.Model
	Notices   []Notice
}

// Publish derives the devices a node publishes from its hardware, its
// prepared claims and the features' publishing choices. It is pure, and
// it is the one place those rules live: the kubelet plugin, `gpudra
// inspect` and the local cluster all call it. build nil means
// devicemodel.Build.
func Publish(build ModelBuilder, inv, previous *hardware.Inventory, state *claimstate.State, publishers []Publisher) (*Published, error) {
	in := &PublishInput{Inventory: inv, Previous: previous, State: state}
	for _, p := range publishers {
		p.Publish(in)
	}
	if build == nil {
		build = devicemodel.Build
	}
	model, err := build(in.Inventory, in.Options...)
	if err != nil {
		return nil, fmt.Errorf("build device model: %w", err)
	}
	return &Published{Inventory: in.Inventory, Model: model, Notices: in.Notices}, nil
}
