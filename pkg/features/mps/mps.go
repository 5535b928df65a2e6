// Package mps is the configurator of MPS: a claim whose config asks
// for sharing strategy MPS, or that holds capped shares of a shared GPU
// (fractional GPUs), gets one MPS control daemon with its limits, started
// at Prepare after its MIG devices exist, supervised, adopted after a
// restart, and stopped at Unprepare before anything it serves is torn
// down. A container reaches one daemon (one pipe directory), so a claim
// has at most one, and a consumer (a pod, or a PodGroup whose pods share
// the claim) at most one MPS claim on a node. The daemon is the claim's,
// not a pod's: every pod using the claim on the node reaches the same one.
package mps

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/claimconfig"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/features/sharing"
	"github.com/gpudra/gpudra/pkg/mps"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// Name is the configurator's record name in the checkpoint.
const Name = "mps"

// Record lists a claim's daemons (one, today).
type Record struct {
	Daemons []Daemon `json:"daemons"`
}

// Daemon is one MPS control daemon and the devices it serves.
type Daemon struct {
	ID      string   `json:"id"`
	Devices []string `json:"devices"`
}

// mpsField is the path of a GpuConfig's or MigDeviceConfig's MPS settings;
// errors about them name it.
var mpsField = field.NewPath("sharing", "mpsConfig")

// ErrMPSConsumer refuses a second MPS claim for one pod or PodGroup.
var ErrMPSConsumer = errors.New("one MPS daemon per pod")

// Configurator runs the claims' MPS daemons.
type Configurator struct {
	mps *mps.Manager
	// unavailable says why the node cannot run MPS daemons (mps nil).
	unavailable string
	// timeSlicing adds TimeSlicing to the strategies an error offers.
	timeSlicing bool
}

var (
	_ preparer.Feature[Record]         = &Configurator{}
	_ preparer.FeatureGuard[Record]    = &Configurator{}
	_ preparer.FeatureEditor[Record]   = &Configurator{}
	_ preparer.FeatureRestorer[Record] = &Configurator{}
	_ preparer.Adopter                 = &Configurator{}
	_ preparer.FeatureMetadata[Record] = &Configurator{}
)

// records writes the records of the claims Adopt finds.
var codec = preparer.Codec[Record]{Name: Name}

// New returns the configurator; manager nil refuses MPS, with unavailable
// as the reason ("" gives the default). timeSlicing says whether the node
// offers time-slicing instead.
func New(manager *mps.Manager, unavailable string, timeSlicing bool) *Configurator {
	if unavailable == "" {
		unavailable = "no MPS control binary: see --mps-control-binary"
	}
	return &Configurator{mps: manager, unavailable: unavailable, timeSlicing: timeSlicing}
}

// Name implements [preparer.Feature].
func (c *Configurator) Name() string { return Name }

// plan is the claim's daemon as its configs and shares ask for it.
type plan struct {
	id string
	// devices are the claim's devices it serves, by index.
	devices []int
	// config is the claim's MPS config; nil when the daemon serves
	// fractional shares only.
	config *v1beta1.MpsConfig
	origin claimconfig.Origin
	// shares are the caps of the fractional shares it serves, by index.
	shares map[int]devicemodel.ShareLimits
}

// planOf works out the claim's daemon, or nil.
func (c *Configurator) planOf(cl *preparer.Claim) (*plan, error) {
	var p *plan
	add := func(i int, mc *v1beta1.MpsConfig, origin claimconfig.Origin, withConfig bool) error {
		if p == nil {
			p = &plan{id: cl.UID, shares: map[int]devicemodel.ShareLimits{}}
		}
		if withConfig {
			// Two different MPS configs in one claim would need two
			// daemons, and a container reaches only one.
			if p.config != nil && p.config != mc {
				return fmt.Errorf("%s asks for an MPS daemon of its own, but %s already asks for one for this claim: a container reaches one MPS daemon, so a claim's MPS devices must share one config",
					origin, p.origin)
			}
			if p.config == nil {
				p.config, p.origin = mc, origin
			}
		}
		p.devices = append(p.devices, i)
		return nil
	}
	for i, d := range cl.Devices {
		if d.State.AdminAccess {
			continue
		}
		strategy, _, mc := sharing.Settings(d.Config.Config)
		capped, limits, err := sharing.ShareLimits(d)
		if err != nil {
			return nil, err
		}
		name := d.Model.Name()
		switch {
		case capped:
			// A fractional share's caps are enforced by an MPS daemon of
			// its own, whatever the config says (time-slicing refuses it).
			if c.mps == nil {
				return nil, fmt.Errorf("device %s: share %s of a GPU shared by %s is capped through an MPS daemon, but this node cannot run MPS daemons (%s)",
					name, d.State.ShareID, d.Model.Sharing, c.unavailable)
			}
			if err := add(i, mc, d.Config.Origin, strategy == v1beta1.MpsStrategy); err != nil {
				return nil, fmt.Errorf("device %s: %w", name, err)
			}
			p.shares[i] = limits
		case strategy == v1beta1.MpsStrategy:
			if c.mps == nil {
				hint := ""
				if c.timeSlicing {
					hint = ", sharing.strategy TimeSlicing"
				}
				return nil, fmt.Errorf("device %s: %s: sharing.strategy MPS: this node cannot run MPS daemons (%s); allowed here: no sharing setting%s",
					name, d.Config.Origin, c.unavailable, hint)
			}
			if err := add(i, mc, d.Config.Origin, true); err != nil {
				return nil, fmt.Errorf("device %s: %w", name, err)
			}
		}
	}
	// Config values (a thread percentage of 0, a limit that is no whole
	// MiB) were refused by claimconfig.Resolve, with the webhook's rule.
	return p, nil
}

// Plan implements [preparer.Feature].
func (c *Configurator) Plan(_ context.Context, cl *preparer.Claim) (*Record, error) {
	p, err := c.planOf(cl)
	if err != nil || p == nil {
		return nil, err
	}
	d := Daemon{ID: p.id}
	for _, i := range p.devices {
		if name := cl.Devices[i].Model.Name(); !slices.Contains(d.Devices, name) {
			d.Devices = append(d.Devices, name)
		}
	}
	return &Record{Daemons: []Daemon{d}}, nil
}

// Guard implements [preparer.FeatureGuard]: a consumer must not get a
// second MPS claim on this node. Two claims' daemons in one container
// would leave it with whichever pipe directory the runtime mounted last.
// The plugin sees what a claim is reserved for, not containers: pods, or
// a PodGroup (KEP-5729) whose pods it is not told, so the refusal is per
// pod or per PodGroup (any pod of the group may use both claims). It runs
// inside the checkpoint update that records the start, so of two such
// claims prepared at once exactly one is refused.
func (c *Configurator) Guard(s *claimstate.State, cl *claimstate.Claim, _ *Record) error {
	for _, uid := range slices.Sorted(maps.Keys(s.Claims)) {
		other := s.Claims[uid]
		if uid == cl.UID || other.Records[Name] == nil {
			continue
		}
		for _, consumer := range cl.Consumers {
			if slices.ContainsFunc(other.Consumers, func(o claimstate.Consumer) bool { return o.UID == consumer.UID }) {
				return &preparer.RefusedError{Err: fmt.Errorf("%w: %s %s/%s already uses MPS claim %s/%s (uid %s) on this node, and a container reaches one MPS daemon (one pipe directory): put the %s's MPS devices in one claim",
					ErrMPSConsumer, consumer.Kind(), cl.Namespace, consumer.Name, other.Namespace, other.Name, other.UID, consumer.Kind())}
			}
		}
	}
	return nil
}

// Apply implements [preparer.Feature]: it starts the daemon, now that
// every device it serves has its UUID, and gives the devices its
// directories and environment.
func (c *Configurator) Apply(ctx context.Context, cl *preparer.Claim, rec *Record) (*Record, error) {
	if c.mps == nil {
		return nil, fmt.Errorf("this node cannot run MPS daemons (%s)", c.unavailable)
	}
	p, err := c.planOf(cl)
	if err != nil {
		return nil, err
	}
	if p == nil {
		return nil, errors.New("the claim's MPS daemon is no longer planned")
	}
	spec, err := specOf(p, cl)
	if err != nil {
		return nil, err
	}
	daemon, err := c.mps.Start(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("start the claim's MPS daemon: %w", err)
	}
	edits := daemon.ContainerEdits()
	for _, i := range p.devices {
		cl.Devices[i].AddEdits(edits)
	}
	return rec, nil
}

// Edits implements [preparer.FeatureEditor].
func (c *Configurator) Edits(_ context.Context, cl *preparer.Claim, rec *Record) error {
	for _, dm := range rec.Daemons {
		if c.mps == nil {
			return fmt.Errorf("devices %v are served by MPS daemon %s, but this node cannot run MPS daemons now (%s)", dm.Devices, dm.ID, c.unavailable)
		}
		// The ID names the host directories mounted into the containers:
		// one from a damaged record must not reach outside the MPS root.
		if err := mps.ValidateID(dm.ID); err != nil {
			return fmt.Errorf("devices %v: MPS daemon of the claim's record: %w", dm.Devices, err)
		}
		edits := mps.Daemon{Dirs: c.mps.Dirs(dm.ID)}.ContainerEdits()
		for _, d := range cl.Devices {
			if slices.Contains(dm.Devices, d.Model.Name()) {
				d.AddEdits(edits)
			}
		}
	}
	return nil
}

// Undo implements [preparer.Feature]: it stops the claim's daemons.
func (c *Configurator) Undo(ctx context.Context, _ string, rec *Record) error {
	var errs []error
	for _, dm := range rec.Daemons {
		if c.mps == nil {
			errs = append(errs, fmt.Errorf("stop MPS daemon %s: this node cannot run MPS daemons now (%s)", dm.ID, c.unavailable))
			continue
		}
		if err := c.mps.Stop(ctx, dm.ID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Restore implements [preparer.FeatureRestorer]: the recorded daemons are taken
// under supervision, and any that died is started again.
func (c *Configurator) Restore(ctx context.Context, held []preparer.Held[Record]) error {
	var errs []error
	for _, h := range held {
		cl, rec := h.Claim, h.Record
		for _, dm := range rec.Daemons {
			if c.mps == nil {
				errs = append(errs, fmt.Errorf("claim %s: MPS daemon %s cannot be supervised: this node cannot run MPS daemons now (%s)", cl.UID, dm.ID, c.unavailable))
				continue
			}
			if _, err := c.mps.Adopt(ctx, dm.ID); err != nil {
				errs = append(errs, fmt.Errorf("claim %s: take over MPS daemon %s: %w", cl.UID, dm.ID, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Adopt implements [preparer.Adopter]: a claim adopted without this
// configurator's record whose daemon directory exists (the daemon of its
// UID) owns that daemon, so that Unprepare stops it.
func (c *Configurator) Adopt(_ context.Context, a *preparer.Adoption) error {
	if c.mps == nil {
		return nil
	}
	for uid, cl := range a.Claims {
		if cl.Records[Name] != nil {
			continue
		}
		if _, err := os.Stat(c.mps.Dirs(uid).Root); err != nil {
			continue
		}
		d := Daemon{ID: uid}
		for _, dev := range cl.Devices {
			if !slices.Contains(d.Devices, dev.Name) {
				d.Devices = append(d.Devices, dev.Name)
			}
		}
		if err := codec.Set(cl, &Record{Daemons: []Daemon{d}}); err != nil {
			return err
		}
	}
	return nil
}

// specOf is the spec of the claim's daemon, once every device it serves
// has its UUID.
func specOf(p *plan, cl *preparer.Claim) (mps.Spec, error) {
	spec := mps.Spec{ID: p.id}
	for _, i := range p.devices {
		st := cl.Devices[i].State
		if st.UUID == "" {
			return mps.Spec{}, fmt.Errorf("MPS daemon %s: device %s has no UUID yet", p.id, st.Name)
		}
		if !slices.Contains(spec.DeviceUUIDs, st.UUID) {
			spec.DeviceUUIDs = append(spec.DeviceUUIDs, st.UUID)
		}
	}
	if err := p.applyShareCaps(&spec, cl); err != nil {
		return mps.Spec{}, err
	}
	mc := p.config
	if mc == nil {
		return spec, nil
	}
	lowerThreads(&spec, mc.DefaultActiveThreadPercentage)
	spec.MultiUser = mc.MultiUser
	limits := map[string]int64{}
	if q := mc.DefaultPinnedDeviceMemoryLimit; q != nil {
		for _, uuid := range spec.DeviceUUIDs {
			limits[uuid] = q.Value()
		}
	}
	// Keys are a device's index among the devices the config applies to,
	// or its UUID. A device named by both would get one of two limits.
	keyOf := map[string]string{}
	for _, key := range slices.Sorted(maps.Keys(mc.DefaultPerDevicePinnedMemoryLimit)) {
		q := mc.DefaultPerDevicePinnedMemoryLimit[key]
		uuid := key
		if n, err := strconv.Atoi(key); err == nil {
			if n < 0 || n >= len(spec.DeviceUUIDs) {
				return mps.Spec{}, fmt.Errorf("%s: %s: index %d is not one of the %d devices the config applies to (allowed: 0 to %d, or a device UUID)",
					p.origin, mpsField.Child("defaultPerDevicePinnedMemoryLimit").Key(key), n, len(spec.DeviceUUIDs), len(spec.DeviceUUIDs)-1)
			}
			uuid = spec.DeviceUUIDs[n]
		} else if !slices.Contains(spec.DeviceUUIDs, uuid) {
			return mps.Spec{}, fmt.Errorf("%s: %s: not the UUID of a device the config applies to (allowed: %v, or an index 0 to %d)",
				p.origin, mpsField.Child("defaultPerDevicePinnedMemoryLimit").Key(key), spec.DeviceUUIDs, len(spec.DeviceUUIDs)-1)
		}
		if other, named := keyOf[uuid]; named {
			return mps.Spec{}, fmt.Errorf("%s: %s and %s name the same device %s: give it one limit",
				p.origin, mpsField.Child("defaultPerDevicePinnedMemoryLimit").Key(other), mpsField.Child("defaultPerDevicePinnedMemoryLimit").Key(key), uuid)
		}
		keyOf[uuid] = key
		limits[uuid] = q.Value()
	}
	// A config's limits can lower a share's caps, never raise them.
	for uuid, capped := range spec.PinnedMemoryLimits {
		if l, ok := limits[uuid]; !ok || l > capped {
			limits[uuid] = capped
		}
	}
	if len(limits) > 0 {
		spec.PinnedMemoryLimits = limits
	}
	return spec, nil
}

// applyShareCaps sets the caps of the fractional shares the daemon serves:
// the pinned memory of each GPU is the sum of its shares' (two shares of
// one GPU in a claim are one client), and the thread percentage, which is
// one for the whole daemon, is the largest share's of any GPU; shares of
// one claim on GPUs with different compute caps are refused, since one
// daemon cannot cap them differently.
func (p *plan) applyShareCaps(spec *mps.Spec, cl *preparer.Claim) error {
	if len(p.shares) == 0 {
		return nil
	}
	memory := map[string]int64{}
	threads := map[string]int{}
	for _, i := range slices.Sorted(maps.Keys(p.shares)) {
		uuid, caps := cl.Devices[i].State.UUID, p.shares[i]
		if caps.PinnedMemoryBytes > 0 {
			memory[uuid] += caps.PinnedMemoryBytes
		}
		threads[uuid] = min(threads[uuid]+caps.ActiveThreadPercentage, 100)
	}
	if len(memory) > 0 {
		spec.PinnedMemoryLimits = memory
	}
	var pct int
	for _, uuid := range slices.Sorted(maps.Keys(threads)) {
		t := threads[uuid]
		if pct != 0 && t != pct {
			return fmt.Errorf("MPS daemon %s: the claim's shares cap compute at %d%% on one GPU and %d%% on another, and one MPS daemon has one thread percentage: put shares with different compute in different claims", p.id, pct, t)
		}
		pct = t
	}
	if pct > 0 {
		spec.ActiveThreadPercentage = &pct
	}
	return nil
}

// lowerThreads applies a config's thread percentage, which can only lower
// a share's cap.
func lowerThreads(spec *mps.Spec, pct *int) {
	if pct == nil {
		return
	}
	if spec.ActiveThreadPercentage == nil || *pct < *spec.ActiveThreadPercentage {
		v := *pct
		spec.ActiveThreadPercentage = &v
	}
}
