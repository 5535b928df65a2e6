package draplugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// apiCallTimeout bounds each API call of the sweep, so that one hung
// connection cannot stall it.
const apiCallTimeout = 10 * time.Second

// cachedGet reads an object from the API server's watch cache
// (resourceVersion "0": any version the server has) rather than from
// etcd.
var cachedGet = metav1.GetOptions{ResourceVersion: "0"}

// maxRecheckSweeps caps the back-off of the sweep's look at a claim the
// API server has: at most every 16 sweep intervals (16 minutes by
// default).
const maxRecheckSweeps = 16

// sweeper cleans up what the kubelet will never ask for.
type sweeper struct {
	d *Driver
	// mu serializes sweeps; goneOnce holds the claims the last sweep found
	// gone from the API server, and present, for each claim the API
	// server had at the last look, when the periodic sweep looks again.
	mu       sync.Mutex
	goneOnce map[string]bool
	present  map[string]recheck
	// adoptNow wakes the loop when the checkpoint was found unreadable,
	// or a Prepare was refused because of what another claim holds.
	adoptNow chan struct{}
	// startedAges and specAges age started records and orphaned CDI
	// specs whose time stamps lie in the future.
	startedAges, specAges futureStamps
}

// futureStamps ages things by a wall-clock time stamp that may lie in the
// future: the clock was stepped back since it was taken (NTP after a boot
// with a wrong RTC, an operator). Such a stamp counts as taken when the
// sweep first saw it, and its age is measured from then on the monotonic
// clock (times from Config.Clock, time.Now by default, carry its
// reading), so what it stamps is not kept until the clock catches up.
// A plugin that restarts starts counting again.
type futureStamps struct {
	mu   sync.Mutex
	seen map[string]stampSeen
}

type stampSeen struct{ stamp, at time.Time }

// age returns how old the stamp of key is at now.
func (f *futureStamps) age(key string, stamp, now time.Time) time.Duration {
	if !stamp.After(now) {
		return now.Sub(stamp)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.seen[key]
	if !ok || !s.stamp.Equal(stamp) {
		if f.seen == nil {
			f.seen = map[string]stampSeen{}
		}
		s = stampSeen{stamp: stamp, at: now}
		f.seen[key] = s
	}
	return max(now.Sub(s.at), 0)
}

// keepOnly forgets the stamps of every key not in keep.
func (f *futureStamps) keepOnly(keep map[string]bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for key := range f.seen {
		if !keep[key] {
			delete(f.seen, key)
		}
	}
}

// recheck is when the periodic sweep next asks the API server about a
// claim it had, and how long it waited since the last time.
type recheck struct {
	at    time.Time
	after time.Duration
}

// wake makes the loop sweep at once.
func (w *sweeper) wake() {
	select {
	case w.adoptNow <- struct{}{}:
	default:
	}
}

// suspect makes the next sweeps ask about every claim again, and sweeps
// at once: a Prepare was refused because another claim holds its devices,
// perhaps a claim whose objects are gone (a kubelet that lost its own
// state never unprepares it) and whose devices the scheduler gave to the
// refused claim.
func (w *sweeper) suspect() {
	w.mu.Lock()
	clear(w.present)
	w.mu.Unlock()
	w.wake()
}

// loop sweeps every SweepInterval, and at once when woken, until ctx ends.
// Unlike [Driver.Sweep] it backs off from claims the API server has.
func (w *sweeper) loop(ctx context.Context) {
	ticker := time.NewTicker(w.d.cfg.SweepInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-w.adoptNow:
		}
		w.sweep(ctx, true)
	}
}

// Sweep cleans up what the kubelet will never ask for: preparations started
// longer ago than the kubelet's call timeout are rolled back, completed
// claims whose ResourceClaim and consumers (pods, PodGroups) are gone on two sweeps in a
// row are released, and CDI specs with no record that are older than the
// call timeout are removed. After the checkpoint was lost it first adopts
// the claims whose specs are on the node. It asks the API server about
// every completed claim.
//
// The periodic sweep does the same, but backs off from a claim the API
// server had at its last look: it asks again after one sweep interval,
// then two, four, and so on up to [maxRecheckSweeps]. Every node asks
// about every claim it holds, so without it a fleet of 1,000 nodes of 8
// claims sends the API server 133 GETs a second for claims that are
// almost always there; with it, about 8. A claim whose objects vanish is
// released at most that much later, unless a Prepare is refused in
// between because another claim holds its devices (the scheduler gave
// them to it): that makes the sweep ask about every claim again at once.
func (d *Driver) Sweep(ctx context.Context) { d.sweeper.sweep(ctx, false) }

func (w *sweeper) sweep(ctx context.Context, backOff bool) {
	d := w.d
	w.mu.Lock()
	defer w.mu.Unlock()
	logger := klog.FromContext(ctx).WithName("sweep")
	ctx = klog.NewContext(ctx, logger)
	if d.store.NeedsAdoption() {
		if err := d.prep.AdoptIfNeeded(ctx, d.current().Inventory); err != nil {
			logger.Error(err, "Adopting claims; no CDI spec is removed until that works")
			return
		}
	}
	state, err := d.store.Read(ctx)
	if err != nil {
		logger.Error(err, "Reading checkpoint")
		return
	}
	lookup := &apiLookup{d: d}
	w.nameUnnamed(ctx, state, lookup)
	now := d.cfg.Clock()
	for uid := range w.present {
		if state.Claims[uid] == nil {
			delete(w.present, uid)
		}
	}
	// A start stamped in the future counts as now for PlanSweep, from
	// when the sweep first saw it; the plan gets the recorded stamp back,
	// which sweepClaim compares.
	future := map[string]time.Time{}
	for uid, c := range state.Claims {
		if c.Phase == claimstate.PrepareStarted && c.StartedAt.After(now) {
			future[uid] = c.StartedAt
			c.StartedAt = now.Add(-w.startedAges.age(uid, c.StartedAt, now))
		}
	}
	w.startedAges.keepOnly(keysOf(future))
	plan := state.PlanSweep(now, d.cfg.CallTimeout, func(c *claimstate.Claim) bool {
		if r, ok := w.present[c.UID]; backOff && ok && now.Before(r.at) {
			return false
		}
		gone, known := lookup.gone(ctx, c)
		if known && !gone {
			w.backOff(c.UID, now)
		} else {
			delete(w.present, c.UID)
		}
		return w.goneTwice(c.UID, gone)
	})
	for _, c := range plan.RollBack {
		if stamp, ok := future[c.UID]; ok {
			c.StartedAt = stamp
		}
		w.sweepClaim(ctx, logger, c, claimstate.PrepareStarted, "Rolled back a preparation the kubelet gave up on")
	}
	for _, c := range plan.Release {
		w.sweepClaim(ctx, logger, c, claimstate.PrepareCompleted, "Released a claim whose ResourceClaim and consumers are gone")
	}
	w.removeOrphanSpecs(ctx)
}

// backOff doubles the wait before the periodic sweep asks about a claim
// the API server had again, from one sweep interval up to
// maxRecheckSweeps of them. The next look is due half an interval early,
// so that the sweep one interval on, which runs a little more or less
// than an interval later, is not skipped.
func (w *sweeper) backOff(uid string, now time.Time) {
	interval := w.d.cfg.SweepInterval
	after := min(2*w.present[uid].after, maxRecheckSweeps*interval)
	after = max(after, interval)
	w.present[uid] = recheck{at: now.Add(after - interval/2), after: after}
}

// goneTwice reports a claim gone only when the previous sweep found it gone
// too: a claim and its pods can vanish from the API server (a forced
// deletion) a little before the containers on the node stop.
func (w *sweeper) goneTwice(uid string, gone bool) bool {
	if !gone {
		delete(w.goneOnce, uid)
		return false
	}
	if w.goneOnce[uid] {
		delete(w.goneOnce, uid)
		return true
	}
	w.goneOnce[uid] = true
	return false
}

// nameUnnamed fills in the namespace, name and consumers of the recorded
// claims whose name is not known, and that the API server still has, so
// that the usual rules apply to them: refusals name them, and later sweeps
// GET them instead of listing every ResourceClaim. Such claims were
// adopted: from their CDI specs after the checkpoint was lost, or from
// NVIDIA's DRA driver's checkpoint, which drops a claim's name once it is
// prepared.
func (w *sweeper) nameUnnamed(ctx context.Context, state *claimstate.State, lookup *apiLookup) {
	d := w.d
	for uid, c := range state.Claims {
		if c.Name != "" {
			continue
		}
		claim, ok := lookup.claimByUID(ctx, uid)
		if !ok {
			continue
		}
		consumers := preparer.ConsumersOf(claim)
		err := d.store.Update(ctx, func(s *claimstate.State) error {
			if rec := s.Claims[uid]; rec != nil && rec.Name == "" {
				named := rec.Clone()
				named.Namespace, named.Name, named.Consumers = claim.Namespace, claim.Name, consumers
				s.Claims[uid] = named
			}
			return nil
		})
		if err != nil {
			klog.FromContext(ctx).Error(err, "Naming an adopted claim", "claimUID", uid)
			continue
		}
		c.Namespace, c.Name, c.Consumers = claim.Namespace, claim.Name, consumers
	}
}

// sweepClaim undoes one claim under its lock, if it is still in the phase
// the sweep saw: a Prepare or Unprepare may have won the race.
func (w *sweeper) sweepClaim(ctx context.Context, logger klog.Logger, c *claimstate.Claim, phase claimstate.Phase, msg string) {
	d := w.d
	unlock, err := d.prep.LockClaim(ctx, c.UID)
	if err != nil {
		logger.Error(err, "Sweeping claim", "claim", klog.KRef(c.Namespace, c.Name), "claimUID", c.UID)
		return
	}
	defer unlock()
	state, err := d.store.Read(ctx)
	if err != nil {
		logger.Error(err, "Reading checkpoint")
		return
	}
	current := state.Claims[c.UID]
	if current == nil || current.Phase != phase || !current.StartedAt.Equal(c.StartedAt) {
		return
	}
	if err := d.prep.RollBack(ctx, current, true); err != nil {
		logger.Error(err, "Sweeping claim", "claim", klog.KRef(c.Namespace, c.Name), "claimUID", c.UID)
		return
	}
	if err := d.removeDeviceMetadata(current.Namespace, current.Name, current.UID); err != nil {
		// Nothing holds a device any more; the files only take space.
		logger.Error(err, "Removing the device metadata of a swept claim", "claim", klog.KRef(c.Namespace, c.Name), "claimUID", c.UID)
	}
	logger.Info(msg, "claim", klog.KRef(c.Namespace, c.Name), "claimUID", c.UID, "devices", len(c.Devices))
}

// apiLookup answers the sweep's questions to the API server. Any API error
// counts as "not gone": releasing a device in use is far worse than keeping
// a stale record a while longer.
type apiLookup struct {
	d *Driver
	// claims, listed once per sweep when an adopted claim needs it.
	claims map[string]*resourceapi.ResourceClaim
	listed bool
	failed bool
}

// gone reports whether a claim and every pod or PodGroup it was reserved for no longer
// exist (or exist only as new objects with the same name); known is false
// when the API server did not answer, which counts as "not gone".
func (l *apiLookup) gone(ctx context.Context, c *claimstate.Claim) (gone, known bool) {
	if c.Name == "" {
		// An adopted claim the API server did not name: gone if a
		// successful list does not have it.
		_, ok := l.claimByUID(ctx, c.UID)
		return !ok && !l.failed, !l.failed
	}
	callCtx, cancel := context.WithTimeout(ctx, apiCallTimeout)
	defer cancel()
	// Served from the API server's watch cache, not read from etcd: every
	// node asks about every claim it holds each sweep. A cache that lags
	// can only show a claim or pod that is already gone, which keeps the
	// claim one more sweep; what it shows as gone is gone (the claim was
	// created before it was prepared), and goneTwice asks twice.
	claim, err := l.d.cfg.KubeClient.ResourceV1().ResourceClaims(c.Namespace).Get(callCtx, c.Name, cachedGet)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return false, false
	case string(claim.UID) == c.UID:
		return false, true
	}
	for _, consumer := range c.Consumers {
		uid, err := l.consumerUID(callCtx, c.Namespace, consumer)
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return false, false
		case uid == consumer.UID:
			return false, true
		}
	}
	return true, true
}

// consumerUID returns the UID of the object a claim was reserved for: a
// pod, or a PodGroup whose pods share the claim (KEP-5729). A PodGroup
// where the API server does not serve them (GenericWorkload off) is
// NotFound, and so gone. Other kinds are not looked up: they count as
// gone, as they did when only pods were recorded, so that they never
// keep a claim's devices once the claim itself is gone.
func (l *apiLookup) consumerUID(ctx context.Context, namespace string, consumer claimstate.Consumer) (string, error) {
	client := l.d.cfg.KubeClient
	switch {
	case consumer.IsPod():
		pod, err := client.CoreV1().Pods(namespace).Get(ctx, consumer.Name, cachedGet)
		if err != nil {
			return "", err
		}
		return string(pod.UID), nil
	case consumer.IsPodGroup():
		group, err := client.SchedulingV1beta1().PodGroups(namespace).Get(ctx, consumer.Name, cachedGet)
		if err != nil {
			return "", err
		}
		return string(group.UID), nil
	}
	return "", apierrors.NewNotFound(schema.GroupResource{Group: consumer.APIGroup, Resource: consumer.Resource}, consumer.Name)
}

// claimByUID finds a ResourceClaim by UID in a list of all claims, taken at
// most once per sweep.
func (l *apiLookup) claimByUID(ctx context.Context, uid string) (*resourceapi.ResourceClaim, bool) {
	if !l.listed {
		l.listed = true
		callCtx, cancel := context.WithTimeout(ctx, apiCallTimeout)
		defer cancel()
		list, err := l.d.cfg.KubeClient.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(callCtx, metav1.ListOptions{})
		if err != nil {
			klog.FromContext(ctx).Error(err, "Listing ResourceClaims to find adopted claims")
			l.failed = true
			return nil, false
		}
		l.claims = make(map[string]*resourceapi.ResourceClaim, len(list.Items))
		for i := range list.Items {
			l.claims[string(list.Items[i].UID)] = &list.Items[i]
		}
	}
	c, ok := l.claims[uid]
	return c, ok
}

// removeOrphanSpecs removes CDI specs of this driver that no claim record
// owns and that are older than the kubelet's call timeout (a younger one may
// belong to a preparation in flight in a second plugin instance). A spec
// modified in the future counts as modified when first seen
// (futureStamps).
func (w *sweeper) removeOrphanSpecs(ctx context.Context) {
	d := w.d
	logger := klog.FromContext(ctx)
	uids, err := d.cdi.ClaimUIDs()
	if err != nil {
		logger.Error(err, "Listing CDI specs")
		return
	}
	if len(uids) == 0 {
		return
	}
	state, err := d.store.Read(ctx)
	if err != nil {
		logger.Error(err, "Reading checkpoint")
		return
	}
	future := map[string]bool{}
	defer func() { w.specAges.keepOnly(future) }()
	for _, uid := range uids {
		if state.Claims[uid] != nil {
			continue
		}
		unlock, err := d.prep.LockClaim(ctx, uid)
		if err != nil {
			logger.Error(err, "Removing orphaned CDI spec", "claimUID", uid)
			continue
		}
		removed, err := w.removeOrphanSpec(uid, future)
		unlock()
		if err != nil {
			logger.Error(err, "Removing orphaned CDI spec", "claimUID", uid)
		} else if removed {
			logger.Info("Removed orphaned CDI spec", "claimUID", uid)
		}
	}
}

// removeOrphanSpec removes a claim's spec if it is older than the call
// timeout; future collects the claims whose specs are modified in the
// future. The caller holds the claim's lock.
func (w *sweeper) removeOrphanSpec(uid string, future map[string]bool) (bool, error) {
	d := w.d
	fi, err := os.Stat(d.cdi.Path(uid))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("stat CDI spec for claim %s: %w", uid, err)
	}
	now, mtime := d.cfg.Clock(), fi.ModTime()
	if mtime.After(now) {
		future[uid] = true
	}
	if w.specAges.age(uid, mtime, now) <= d.cfg.CallTimeout {
		return false, nil
	}
	// Only the spec just looked at: one written since is younger.
	return d.cdi.RemoveIfOlder(uid, mtime.Add(time.Nanosecond))
}

func keysOf[V any](m map[string]V) map[string]bool {
	keys := make(map[string]bool, len(m))
	for k := range m {
		keys[k] = true
	}
	return keys
}
