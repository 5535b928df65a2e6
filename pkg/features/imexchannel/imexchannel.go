// Package imexchannel is the configurator of the IMEX channel devices of
// driver compute-domain.nvidia.com: a claim of a ComputeDomain's channel
// device gets, in every container, the device node of the channel that
// domain holds on this node (/dev/nvidia-caps-imex-channels/channel<N>).
//
// Channels isolate domains: processes import each other's GPU memory over
// NVLink only through the same channel, so two domains on one node must
// never share one. [Channels] decides a domain's channel; the configurator
// records it in the claim's record and its [Configurator.Guard] refuses,
// inside the checkpoint transaction, a claim whose channel another domain
// holds on the node, or a claim that would open every channel (allocation
// mode All) next to another domain. docs/guides/computedomain.md says what the
// isolation relies on.
//
// Nothing on the node changes: the channel device nodes exist while the
// driver is loaded, and a container reaches one only through the CDI edit.
// So Undo has nothing to take down, and a record only holds the channel.
package imexchannel

import (
	"context"
	"errors"
	"fmt"
	"slices"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// Name is the configurator's record name in the checkpoint.
const Name = "imexChannel"

// DefaultMaxChannels is how many IMEX channels the driver offers by
// default (the nvidia module's NVreg_ImexChannelCount), which allocation
// mode All hands out.
const DefaultMaxChannels = 2048

// ChannelDir is where the driver's IMEX channel device nodes live.
const ChannelDir = "/dev/nvidia-caps-imex-channels"

// ChannelPath returns the device node of channel n.
func ChannelPath(n int) string { return fmt.Sprintf("%s/channel%d", ChannelDir, n) }

// Channels tells which IMEX channel a ComputeDomain's pods get. A domain's
// channel must be the same on every node of the domain (a channel is only
// honoured between processes that hold the same one) and differ from every
// other domain's that may share a node with it.
type Channels interface {
	// Channel returns the channel of the domain with the given UID, for a
	// claim in namespace. It refuses a domain that does not exist, or that
	// lives in another namespace than the claim, with an error naming the
	// domainID.
	Channel(ctx context.Context, namespace, domainID string) (int, error)
}

// Daemon is the node's IMEX daemon as channel claims use it: a claim holds
// it from Apply to Undo, and Prepare waits for it to be ready, within the
// kubelet's call deadline. A node without the daemon has none (nil) and
// serves channels only.
type Daemon interface {
	// Hold records that the claim uses the daemon for the domain, in the
	// node's clique; the first holder starts it. It must not wait for
	// the daemon.
	Hold(ctx context.Context, claimUID, domainUID, cliqueID string) error
	// Release drops the claim's hold.
	Release(ctx context.Context, claimUID string) error
	// WaitReady waits for the daemon and, when it gives up, says why.
	WaitReady(ctx context.Context) error
}

// Record is what a claim holds.
type Record struct {
	// Domain is the ComputeDomain's UID.
	Domain string `json:"domain"`
	// Channel is the domain's channel on this node.
	Channel int `json:"channel"`
	// All is set for allocation mode All: the containers get every
	// channel.
	All bool `json:"all,omitempty"`
	// Clique is the node's NVLink clique at Plan, which the IMEX daemon
	// serves; empty for records written before the daemon was supervised.
	Clique string `json:"clique,omitempty"`
}

// Configurator prepares channel claims. It implements
// [preparer.Feature], [preparer.FeatureGuard] and [preparer.FeatureEditor].
type Configurator struct {
	channels    Channels
	maxChannels int
	daemon      Daemon
}

var (
	_ preparer.Feature[Record]         = &Configurator{}
	_ preparer.FeatureGuard[Record]    = &Configurator{}
	_ preparer.FeatureEditor[Record]   = &Configurator{}
	_ preparer.FeatureRestorer[Record] = &Configurator{}
	_ preparer.RecordlessUndoer        = &Configurator{}
	_ preparer.FeatureMetadata[Record] = &Configurator{}
)

// codec reads the other claims' records.
var codec = preparer.Codec[Record]{Name: Name}

// New returns the configurator. maxChannels is the node's channel count;
// 0 means DefaultMaxChannels.
func New(channels Channels, maxChannels int) *Configurator {
	if maxChannels <= 0 {
		maxChannels = DefaultMaxChannels
	}
	return &Configurator{channels: channels, maxChannels: maxChannels}
}

// WithDaemon makes channel claims hold the node's IMEX daemon, and Prepare
// wait for it.
func (c *Configurator) WithDaemon(d Daemon) *Configurator {
	c.daemon = d
	return c
}

// Name implements [preparer.Feature].
func (*Configurator) Name() string { return Name }

// Plan implements [preparer.Feature]: every channel device of the
// claim must be configured by a ComputeDomainChannelConfig naming one and
// the same domain, whose channel it asks of [Channels]. Daemon devices are
// refused: gpudra does not run IMEX daemons through claims (see
// docs/guides/computedomain.md).
func (c *Configurator) Plan(ctx context.Context, claim *preparer.Claim) (*Record, error) {
	var rec *Record
	for _, d := range claim.Devices {
		switch d.Model.Kind {
		case devicemodel.KindDaemon:
			return nil, fmt.Errorf("device %s (request %s): IMEX daemon devices are not prepared by gpudra yet: the node's plugin runs the IMEX daemon itself (docs/guides/computedomain.md)",
				d.State.Name, requestsOf(d))
		case devicemodel.KindChannel:
		default:
			continue
		}
		cfg, ok := d.Config.Config.(*v1beta1.ComputeDomainChannelConfig)
		if !ok || cfg.DomainID == "" {
			return nil, fmt.Errorf("device %s (request %s): domainID: Required value: a channel claim needs a %s naming its ComputeDomain's UID in domainID (%s gives none)",
				d.State.Name, requestsOf(d), v1beta1.ComputeDomainChannelConfigKind, d.Config.Origin)
		}
		all := cfg.AllocationMode == v1beta1.ChannelAllocationModeAll
		if rec != nil {
			if rec.Domain != cfg.DomainID || rec.All != all {
				return nil, fmt.Errorf("device %s (request %s): the claim's channel devices name different domains or allocation modes (%s %s, %s %s): one claim joins one domain",
					d.State.Name, requestsOf(d), rec.Domain, mode(rec.All), cfg.DomainID, mode(all))
			}
			continue
		}
		ch, err := c.channels.Channel(ctx, claim.Namespace, cfg.DomainID)
		if err != nil {
			return nil, fmt.Errorf("device %s (request %s): domainID %s: %w", d.State.Name, requestsOf(d), cfg.DomainID, err)
		}
		if ch < 0 || ch >= c.maxChannels {
			return nil, fmt.Errorf("domainID %s: channel %d is out of this node's range 0..%d", cfg.DomainID, ch, c.maxChannels-1)
		}
		rec = &Record{Domain: cfg.DomainID, Channel: ch, All: all}
		if c.daemon != nil && claim.Inventory != nil {
			clique, err := claim.Inventory.CliqueID()
			if err != nil {
				return nil, fmt.Errorf("domainID %s: the node's NVLink clique, which its IMEX daemon serves: %w", cfg.DomainID, err)
			}
			rec.Clique = clique
		}
	}
	if rec == nil {
		return nil, nil
	}
	return rec, nil
}

// Guard implements [preparer.FeatureGuard]: a channel serves one domain on the
// node, a domain holds one channel on the node, and a claim of mode All
// (every channel) shares the node with no other domain.
func (c *Configurator) Guard(s *claimstate.State, claim *claimstate.Claim, rec *Record) error {
	for _, uid := range sortedUIDs(s) {
		other := s.Claims[uid]
		if uid == claim.UID {
			continue
		}
		o, err := codec.Of(other)
		if err != nil {
			return err
		}
		if o == nil {
			continue
		}
		who := fmt.Sprintf("claim %s/%s (uid %s)", other.Namespace, other.Name, other.UID)
		switch {
		case o.Domain == rec.Domain && o.Channel != rec.Channel:
			return &preparer.RefusedError{Err: fmt.Errorf("domain %s holds channel %d on this node (%s), not %d: a domain's pods on one node share its channel; retry once the domain's channel is settled",
				rec.Domain, o.Channel, who, rec.Channel)}
		case o.Domain == rec.Domain:
		case o.Channel == rec.Channel:
			return &preparer.RefusedError{Err: fmt.Errorf("channel %d of this node serves domain %s (%s); domain %s cannot share it, or its pods could import the other domain's memory",
				rec.Channel, o.Domain, who, rec.Domain)}
		case o.All || rec.All:
			return &preparer.RefusedError{Err: fmt.Errorf("domain %s (%s) and domain %s cannot share this node while one of them has allocation mode All (every channel)",
				o.Domain, who, rec.Domain)}
		}
	}
	return nil
}

// Apply implements [preparer.Feature]: the channel device nodes go
// into every channel device's CDI edits; with a [Daemon], the claim holds
// the node's IMEX daemon and Prepare waits until it is ready (a failed
// wait is rolled back through Undo, which drops the hold).
func (c *Configurator) Apply(ctx context.Context, claim *preparer.Claim, rec *Record) (*Record, error) {
	if err := c.Edits(ctx, claim, rec); err != nil {
		return nil, err
	}
	if c.daemon != nil {
		if err := c.daemon.Hold(ctx, claim.UID, rec.Domain, rec.Clique); err != nil {
			return nil, fmt.Errorf("domainID %s: %w", rec.Domain, err)
		}
		if err := c.daemon.WaitReady(ctx); err != nil {
			return nil, fmt.Errorf("domainID %s: %w", rec.Domain, err)
		}
	}
	return rec, nil
}

// Restore implements [preparer.FeatureRestorer]: the claims prepared before a
// restart hold the daemon again (a running one is taken over).
func (c *Configurator) Restore(ctx context.Context, held []preparer.Held[Record]) error {
	if c.daemon == nil {
		return nil
	}
	var errs []error
	for _, h := range held {
		cl, rec := h.Claim, h.Record
		if err := c.daemon.Hold(ctx, cl.UID, rec.Domain, rec.Clique); err != nil {
			errs = append(errs, fmt.Errorf("claim %s/%s: %w", cl.Namespace, cl.Name, err))
		}
	}
	return errors.Join(errs...)
}

// Edits implements [preparer.FeatureEditor].
func (c *Configurator) Edits(_ context.Context, claim *preparer.Claim, rec *Record) error {
	if claim.Inventory == nil || claim.Inventory.Majors.IMEXChannels == 0 {
		return errors.New("the IMEX channel major is unknown (no nvidia-caps-imex-channels in /proc/devices): the driver offers no IMEX channels")
	}
	major := int64(claim.Inventory.Majors.IMEXChannels)
	channels := []int{rec.Channel}
	if rec.All {
		channels = make([]int, c.maxChannels)
		for i := range channels {
			channels[i] = i
		}
	}
	nodes := make([]*cdispec.DeviceNode, 0, len(channels))
	for _, n := range channels {
		nodes = append(nodes, &cdispec.DeviceNode{Path: ChannelPath(n), Type: "c", Major: major, Minor: int64(n)})
	}
	for _, d := range claim.Devices {
		if d.Model.Kind == devicemodel.KindChannel {
			d.AddEdits(&cdispec.ContainerEdits{DeviceNodes: nodes})
		}
	}
	return nil
}

// Undo implements [preparer.Feature]: the claim's hold on the IMEX
// daemon goes; nothing else was set up.
func (c *Configurator) Undo(ctx context.Context, claimUID string, _ *Record) error {
	if c.daemon == nil {
		return nil
	}
	return c.daemon.Release(ctx, claimUID)
}

// UndoesWithoutRecord implements [preparer.RecordlessUndoer]: the hold is
// the claim's, whatever its record says.
func (c *Configurator) UndoesWithoutRecord() {}

func requestsOf(d *preparer.Device) string {
	return fmt.Sprint(d.State.Requests)
}

func mode(all bool) string {
	if all {
		return v1beta1.ChannelAllocationModeAll
	}
	return v1beta1.ChannelAllocationModeSingle
}

func sortedUIDs(s *claimstate.State) []string {
	uids := make([]string, 0, len(s.Claims))
	for uid := range s.Claims {
		uids = append(uids, uid)
	}
	slices.Sort(uids)
	return uids
}
