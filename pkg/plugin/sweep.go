package plugin

import (
	"context"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

// sweepLoop runs Sweep every SweepInterval until ctx ends.
func (d *Driver) sweepLoop(ctx context.Context) {
	ticker := time.NewTicker(d.cfg.SweepInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			d.Sweep(ctx)
		}
	}
}

// Sweep cleans up what the kubelet will never ask for: preparations started
// longer ago than the kubelet's call timeout are rolled back, completed
// claims whose ResourceClaim and consumer pods are all gone are released,
// and CDI specs with no record that are older than the call timeout are
// removed.
func (d *Driver) Sweep(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("sweep")
	state, err := d.store.Read(ctx)
	if err != nil {
		logger.Error(err, "Reading checkpoint")
		return
	}
	plan := state.PlanSweep(d.now(), d.cfg.CallTimeout, func(c *claimstate.Claim) bool { return d.goneFromAPI(ctx, c) })
	for _, c := range plan.RollBack {
		d.sweepClaim(ctx, logger, c, claimstate.PrepareStarted, "Rolled back a preparation the kubelet gave up on")
	}
	for _, c := range plan.Release {
		d.sweepClaim(ctx, logger, c, claimstate.PrepareCompleted, "Released a claim whose ResourceClaim and pods are gone")
	}
	if !d.keepOrphanSpecs {
		d.removeOrphanSpecs(ctx)
	}
}

// sweepClaim undoes one claim under its lock, if it is still in the phase
// the sweep saw: a Prepare or Unprepare may have won the race.
func (d *Driver) sweepClaim(ctx context.Context, logger klog.Logger, c *claimstate.Claim, phase claimstate.Phase, msg string) {
	d.claimLocks.LockKey(c.UID)
	defer func() { _ = d.claimLocks.UnlockKey(c.UID) }()
	state, err := d.store.Read(ctx)
	if err != nil {
		logger.Error(err, "Reading checkpoint")
		return
	}
	current := state.Claims[c.UID]
	if current == nil || current.Phase != phase || !current.StartedAt.Equal(c.StartedAt) {
		return
	}
	if err := d.rollBack(ctx, current, true); err != nil {
		logger.Error(err, "Sweeping claim", "claim", klog.KRef(c.Namespace, c.Name), "claimUID", c.UID)
		return
	}
	logger.Info(msg, "claim", klog.KRef(c.Namespace, c.Name), "claimUID", c.UID, "devices", len(c.Devices))
}

// goneFromAPI reports whether a claim and every pod it was reserved for no
// longer exist (or exist only as new objects with the same name). Any API
// error counts as "not gone": releasing a device in use is far worse than
// keeping a stale record a while longer.
func (d *Driver) goneFromAPI(ctx context.Context, c *claimstate.Claim) bool {
	claim, err := d.cfg.KubeClient.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return false
	case string(claim.UID) == c.UID:
		return false
	}
	for _, consumer := range c.Consumers {
		pod, err := d.cfg.KubeClient.CoreV1().Pods(c.Namespace).Get(ctx, consumer.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return false
		case string(pod.UID) == consumer.UID:
			return false
		}
	}
	return true
}

// removeOrphanSpecs removes CDI specs of this driver that no claim record
// owns and that are older than the kubelet's call timeout (a younger one may
// belong to a preparation in flight in a second plugin instance).
func (d *Driver) removeOrphanSpecs(ctx context.Context) {
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
	if d.keepOrphanSpecs {
		logger.Info("Keeping CDI specs of claims without a record: the checkpoint was unreadable, so they may belong to running pods",
			"claimUIDs", slices.DeleteFunc(uids, func(uid string) bool { return state.Claims[uid] != nil }))
		return
	}
	for _, uid := range uids {
		if state.Claims[uid] != nil {
			continue
		}
		d.claimLocks.LockKey(uid)
		removed, err := d.cdi.RemoveIfOlder(uid, d.now().Add(-d.cfg.CallTimeout))
		_ = d.claimLocks.UnlockKey(uid)
		if err != nil {
			logger.Error(err, "Removing orphaned CDI spec", "claimUID", uid)
		} else if removed {
			logger.Info("Removed orphaned CDI spec", "claimUID", uid)
		}
	}
}
