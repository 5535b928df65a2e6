package controller

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

// ChannelAssigner hands out IMEX channels to domains: each live domain
// holds one channel, the same on every node, and no two live domains hold
// the same one. It is pure (no API calls): the controller seeds it from
// the domains it lists and records what it hands out on the domain's
// status. It is not safe for concurrent use; the controller's one worker
// owns it.
type ChannelAssigner struct {
	max    int
	owners map[int32]types.UID
	byUID  map[types.UID]int32
}

// NewChannelAssigner returns an assigner of channels 0..max-1.
func NewChannelAssigner(max int) *ChannelAssigner {
	return &ChannelAssigner{max: max, owners: map[int32]types.UID{}, byUID: map[types.UID]int32{}}
}

// Observe records the channel a domain already holds (its status). It
// returns an error when another domain holds the same channel: two
// domains were given one channel (a controller that lost its lease wrote
// after the new leader); the older domain keeps it, and the caller should
// take the channel back from the newer one, which the plugins' guard keeps
// off any node the older one holds.
func (a *ChannelAssigner) Observe(uid types.UID, channel int32) error {
	if owner, ok := a.owners[channel]; ok && owner != uid {
		return fmt.Errorf("channel %d is held by domain %s and domain %s", channel, owner, uid)
	}
	if old, ok := a.byUID[uid]; ok && old != channel {
		delete(a.owners, old)
	}
	a.owners[channel] = uid
	a.byUID[uid] = channel
	return nil
}

// Assign returns the domain's channel, handing out the lowest free one if
// it holds none.
func (a *ChannelAssigner) Assign(uid types.UID) (int32, error) {
	if ch, ok := a.byUID[uid]; ok {
		return ch, nil
	}
	for ch := int32(0); int(ch) < a.max; ch++ {
		if _, taken := a.owners[ch]; !taken {
			a.owners[ch] = uid
			a.byUID[uid] = ch
			return ch, nil
		}
	}
	return 0, fmt.Errorf("all %d IMEX channels are held by live ComputeDomains: delete a domain or raise the nodes' channel count (NVreg_ImexChannelCount and --max-channels)", a.max)
}

// Release frees the channel of a domain that is gone.
func (a *ChannelAssigner) Release(uid types.UID) {
	if ch, ok := a.byUID[uid]; ok {
		delete(a.owners, ch)
		delete(a.byUID, uid)
	}
}

// SeedChannels builds an assigner from the domains as listed: domains
// with a channel keep it, oldest first, and a newer domain holding a
// channel an older one holds is returned in conflicts, to be given a new
// channel.
func SeedChannels(max int, domains []*v1beta1.ComputeDomain) (*ChannelAssigner, []*v1beta1.ComputeDomain) {
	a := NewChannelAssigner(max)
	sorted := slices.Clone(domains)
	slices.SortStableFunc(sorted, func(x, y *v1beta1.ComputeDomain) int {
		if c := x.CreationTimestamp.Compare(y.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(string(x.UID), string(y.UID))
	})
	var conflicts []*v1beta1.ComputeDomain
	for _, d := range sorted {
		if d.Status.Channel == nil || d.DeletionTimestamp != nil && len(d.Finalizers) == 0 {
			continue
		}
		if err := a.Observe(d.UID, *d.Status.Channel); err != nil {
			conflicts = append(conflicts, d)
		}
	}
	return a, conflicts
}
