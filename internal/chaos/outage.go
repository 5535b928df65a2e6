package chaos

import (
	"context"
	"maps"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpudra/gpudra/internal/cutproxy"
)

// outage cuts the plugin off the API server for Options.Outage while the
// kubelet keeps preparing claims allocated just before, and restarts the
// plugin a third of the way in with its slices deleted (as the kubelet
// deletes the slices of a plugin that went away). Every Prepare during the
// outage fails, or hangs, and leaves nothing behind; once the API server
// is back the claims get prepared and the pool is published again, and
// the time both take is recorded.
func (t *trial) outage(ctx context.Context) error {
	f := OutageFigures{Seed: t.seed, Duration: t.o.Outage, Mode: []cutproxy.Mode{cutproxy.Refuse, cutproxy.Blackhole}[t.rng.IntN(2)]}
	if !t.n.running() {
		if err := t.n.kill(); err != nil {
			t.violate("crash: %v", err)
		}
		if err := t.restart(ctx); err != nil {
			return err
		}
	}
	pending, err := t.pendingClaims(ctx)
	if err != nil {
		return err
	}
	t.inOutage = true
	defer func() { t.inOutage = false }()
	t.n.proxy.Cut(f.Mode)
	cutAt := time.Now()
	killAt, restoreAt := cutAt.Add(t.o.Outage/3), cutAt.Add(t.o.Outage)
	deadline := restoreAt.Add(3 * time.Minute)
	killed, restored := false, false
	sliceDone := make(chan error, 1)

	// The kubelet retries the pending claims' Prepare, one call at a
	// time, while the outage runs its course, and after it until the
	// plugin answers for each claim: prepared, or refused for a reason of
	// its own (another claim's time slice on a shared GPU).
	var inflight []*call
	done := make(chan struct{}, 1)
	next := time.Now()
	answered := map[*claim]bool{}
	for {
		var due []*claim
		for _, c := range pending {
			if c.phase == phaseAllocated && t.live[c.obj.UID] == c && !answered[c] {
				due = append(due, c)
			}
		}
		if restored && len(due) == 0 && inflight == nil {
			break
		}
		now := time.Now()
		if now.After(deadline) {
			t.violate("outage: %d claims still failing as a whole 3 minutes after the API server came back", len(due))
			break
		}
		if inflight == nil && len(due) > 0 && !now.Before(next) {
			inflight = []*call{{prepare: true, claims: due}}
			wait := t.issue(ctx, inflight)
			go func() { wait(); done <- struct{}{} }()
		}
		// Wake for the next retry, the kill, the restore, or a second
		// from now, whichever comes first.
		wake := now.Add(time.Second)
		for at, pending := range map[time.Time]bool{next: inflight == nil && len(due) > 0, killAt: !killed, restoreAt: !restored} {
			if pending && at.Before(wake) {
				wake = at
			}
		}
		select {
		case <-done:
			refused := t.collect(ctx, inflight)
			for _, c := range inflight[0].claims {
				o := inflight[0].result[c.obj.UID]
				switch {
				case !restored && o.transport != nil:
					f.PrepareTimeouts++
				case !restored && o.err != "":
					f.PrepareErrors++
					if f.ErrorSample == "" {
						f.ErrorSample = o.err
					}
				case !restored && c.phase == phasePrepared:
					t.violate("outage: claim %s prepared while the plugin could not reach the API server", c.obj.Name)
				case restored && o.transport == nil && !o.whole:
					answered[c] = true
					if f.PrepareRecovery == 0 {
						f.PrepareRecovery = time.Since(restoreAt)
					}
				}
			}
			inflight = nil
			if err := t.checkRefused(ctx, refused); err != nil {
				return err
			}
			next = time.Now().Add(map[bool]time.Duration{false: 500 * time.Millisecond, true: 250 * time.Millisecond}[restored])
		case <-time.After(time.Until(wake)):
		}
		if !killed && !time.Now().Before(killAt) {
			// The plugin restarts without the API server; meanwhile its
			// slices went, as the kubelet deletes a gone plugin's.
			killed = true
			t.kills++
			t.sum.Kills++
			if err := t.n.kill(); err != nil {
				t.violate("crash: %v", err)
			}
			if err := t.deleteSlices(ctx); err != nil {
				return err
			}
			if err := t.restart(ctx); err != nil {
				return err
			}
		}
		if !restored && !time.Now().Before(restoreAt) {
			restored = true
			t.n.proxy.Restore()
			go func() {
				_, err := t.waitForPool(ctx, t.initial, 3*time.Minute)
				f.SliceRecovery = time.Since(restoreAt)
				sliceDone <- err
			}()
		}
	}
	if err := <-sliceDone; err != nil {
		t.violate("outage: %v after the API server came back", err)
	}
	t.checkNode(ctx, "after the API outage", false)
	t.sum.Outages = append(t.sum.Outages, f)
	return nil
}

// pendingClaims allocates two claims for the kubelet to prepare during
// the outage, unpreparing others when the node is full.
func (t *trial) pendingClaims(ctx context.Context) ([]*claim, error) {
	t.sched.refresh()
	var pending []*claim
	for range 10 {
		if len(pending) == 2 {
			break
		}
		if len(t.live) < maxLive {
			c, err := t.newClaim(ctx)
			if err != nil {
				return nil, err
			}
			if c != nil {
				pending = append(pending, c)
				continue
			}
		}
		for _, uid := range slices.Sorted(maps.Keys(t.live)) {
			if c := t.live[uid]; !slices.Contains(pending, c) {
				c.phase = phaseReleasing
				t.roundTrip(ctx, []*call{{claims: []*claim{c}}})
				break
			}
		}
		t.sched.refresh()
	}
	return pending, nil
}

// deleteSlices deletes the node's ResourceSlices, as the kubelet does
// when a plugin is gone.
func (t *trial) deleteSlices(ctx context.Context) error {
	list, err := t.n.listSlices(ctx)
	if err != nil {
		return err
	}
	for _, s := range list {
		if err := t.n.client.ResourceV1().ResourceSlices().Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
			return err
		}
	}
	return nil
}
