package chaos

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// outage cuts the plugin off the API server for Options.Outage while the
// kubelet prepares claims allocated just before, and restarts the plugin
// midway with its slices deleted (as the kubelet deletes the slices of a
// plugin that went away): every Prepare fails, or times out, and leaves
// nothing behind; once the API server is back the claims get prepared and
// the pool is published again, and the time both take is recorded.
func (t *trial) outage(ctx context.Context) error {
	f := OutageFigures{Seed: t.seed, Duration: t.o.Outage, Mode: []cutMode{cutRefuse, cutBlackhole}[t.rng.IntN(2)]}
	if !t.n.running() {
		if err := t.n.kill(); err != nil {
			t.violate("crash: %v", err)
		}
		if err := t.restart(ctx); err != nil {
			return err
		}
	}
	// Two claims to prepare during the outage; room is made for them by
	// unpreparing others when the node is full.
	var pending []*claim
	for range 10 {
		if len(pending) == 2 {
			break
		}
		if len(t.live) < maxLive {
			c, err := t.newClaim(ctx)
			if err != nil {
				return err
			}
			if c != nil {
				pending = append(pending, c)
				continue
			}
		}
		for _, uid := range slices.Sorted(maps.Keys(t.live)) {
			if c := t.live[uid]; !slices.Contains(pending, c) {
				c.phase = phaseReleasing
				calls := []*call{{claims: []*claim{c}}}
				t.issue(ctx, calls)
				t.collect(ctx, calls)
				break
			}
		}
	}
	t.inOutage = true
	defer func() { t.inOutage = false }()
	t.n.proxy.Cut(f.Mode)
	cutAt := time.Now()
	end := cutAt.Add(t.o.Outage)
	restarted := false
	for time.Now().Before(end) {
		if len(pending) > 0 {
			calls := []*call{{prepare: true, claims: slices.Clone(pending)}}
			t.issue(ctx, calls)
			refused := t.collect(ctx, calls)
			for _, c := range pending {
				o := calls[0].result[c.obj.UID]
				switch {
				case o.transport != nil:
					f.PrepareTimeouts++
				case o.err != "":
					f.PrepareErrors++
					if f.ErrorSample == "" {
						f.ErrorSample = o.err
					}
				default:
					t.violate("outage: claim %s prepared while the plugin could not reach the API server", c.obj.Name)
				}
			}
			if err := t.checkRefused(ctx, refused); err != nil {
				return err
			}
		}
		if !restarted && time.Since(cutAt) > t.o.Outage/3 {
			restarted = true
			t.kills++
			t.sum.Kills++
			if err := t.n.kill(); err != nil {
				t.violate("crash: %v", err)
			}
			if err := t.deleteSlices(ctx); err != nil {
				return err
			}
			if err := t.restart(ctx); err != nil {
				return fmt.Errorf("restart without the API server: %w", err)
			}
		}
		time.Sleep(min(500*time.Millisecond, time.Until(end)))
	}
	t.n.proxy.Restore()
	restoredAt := time.Now()

	var wg sync.WaitGroup
	var sliceErr error
	wg.Go(func() {
		_, sliceErr = t.waitForPool(ctx, t.initial, 3*time.Minute)
		f.SliceRecovery = time.Since(restoredAt)
	})
	deadline := restoredAt.Add(3 * time.Minute)
	for {
		var due []*claim
		for _, c := range pending {
			if c.phase == phaseAllocated && t.live[c.obj.UID] == c {
				due = append(due, c)
			}
		}
		if len(due) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.violate("outage: %d claims still not prepared 3 minutes after the API server came back", len(due))
			break
		}
		calls := []*call{{prepare: true, claims: due}}
		t.issue(ctx, calls)
		t.collect(ctx, calls)
		if f.PrepareRecovery == 0 && slices.ContainsFunc(due, func(c *claim) bool { return c.phase == phasePrepared }) {
			f.PrepareRecovery = time.Since(restoredAt)
		}
		time.Sleep(250 * time.Millisecond)
	}
	wg.Wait()
	if sliceErr != nil {
		t.violate("outage: %v after the API server came back", sliceErr)
	}
	t.checkNode(ctx, "after the API outage", false)
	t.sum.Outages = append(t.sum.Outages, f)
	return nil
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
