package draplugin

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicestatus"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// statusTimeout bounds the removal of a claim's status.devices after
// Unprepare, which runs in the background: a status write must never hold
// up Unprepare, and an API server that does not answer must not pile up
// goroutines for ever.
const statusTimeout = 10 * time.Second

// PrepareResourceClaims implements [kubeletplugin.DRAPlugin]. Claims of one
// call are prepared concurrently; their checkpoint writes are
// group-committed. Each claim gets its own result; the call itself fails
// only if the plugin cannot work at all.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	return perClaim(claims, func(c *resourceapi.ResourceClaim) types.UID { return c.UID },
		func(c *resourceapi.ResourceClaim) kubeletplugin.PrepareResult { return d.prepareClaim(ctx, c) }), nil
}

// UnprepareResourceClaims implements [kubeletplugin.DRAPlugin]. Unpreparing
// a claim this node does not know succeeds: the call is idempotent.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	return perClaim(claims, func(c kubeletplugin.NamespacedObject) types.UID { return c.UID },
		func(c kubeletplugin.NamespacedObject) error { return d.unprepareClaim(ctx, c) }), nil
}

// perClaim runs do for every claim, concurrently when there are several,
// and returns the results by claim UID.
func perClaim[C, R any](claims []C, uid func(C) types.UID, do func(C) R) map[types.UID]R {
	results := make(map[types.UID]R, len(claims))
	if len(claims) == 1 {
		results[uid(claims[0])] = do(claims[0])
		return results
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, claim := range claims {
		wg.Go(func() {
			r := do(claim)
			mu.Lock()
			results[uid(claim)] = r
			mu.Unlock()
		})
	}
	wg.Wait()
	return results
}

func (d *Driver) prepareClaim(ctx context.Context, claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	logger := klog.FromContext(ctx).WithValues("claim", klog.KObj(claim), "claimUID", claim.UID)
	ctx = klog.NewContext(ctx, logger)
	began := time.Now()
	prepared, err := d.prep.Prepare(ctx, claim)
	d.metrics.ObservePrepare(time.Since(began), err)
	if err != nil {
		logger.Error(err, "Prepare failed")
		err = fmt.Errorf("prepare claim %s/%s: %w", claim.Namespace, claim.Name, err)
		d.events.prepareFailed(claim, err)
		if heldByAnother(err) {
			d.sweeper.suspect()
		}
		return kubeletplugin.PrepareResult{Err: err}
	}
	if prepared.Record != nil && d.prep.ReportsStatus(prepared.Record) {
		d.recordDeviceStatus(ctx, claim, prepared.Record.Devices)
	}
	logger.V(2).Info("Prepared", "devices", len(prepared.Devices))
	return kubeletplugin.PrepareResult{Devices: prepared.Devices}
}

// heldByAnother reports whether err refuses a claim because of what
// another claim prepared on this node holds: a device, a shared counter, a
// channel or daemon.
func heldByAnother(err error) bool {
	var conflict *claimstate.ConflictError
	var refused *preparer.RefusedError
	return errors.As(err, &conflict) || errors.As(err, &refused)
}

func (d *Driver) unprepareClaim(ctx context.Context, claim kubeletplugin.NamespacedObject) error {
	logger := klog.FromContext(ctx).WithValues("claim", claim.NamespacedName, "claimUID", claim.UID)
	ctx = klog.NewContext(ctx, logger)
	began := time.Now()
	reported, err := d.prep.Unprepare(ctx, claim)
	d.metrics.ObserveUnprepare(time.Since(began), err)
	if err != nil {
		return err
	}
	if !d.cfg.DeviceMetadata {
		// The helper removes the files only while it writes them.
		if err := d.removeDeviceMetadata(claim.Namespace, claim.Name, string(claim.UID)); err != nil {
			return fmt.Errorf("unprepare claim %s: %w", claim.NamespacedName, err)
		}
	}
	if reported {
		// The claim usually outlives its pods a moment; drop the UUIDs of
		// devices that no longer exist. Gone claims need nothing. In the
		// background, bounded, so that an API server that does not answer
		// never holds up Unprepare; a Prepare of the same claim waits for
		// it, so that its own status is never overwritten by the removal.
		done := d.statusWrites.start(claim.UID)
		d.wg.Go(func() {
			defer done()
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), statusTimeout)
			defer cancel()
			if err := d.status.Remove(ctx, claim); err != nil {
				logger.Error(err, "Removing the claim's device status (status.devices)")
			}
		})
	}
	return nil
}

// pendingWrites tracks the background status removals per claim.
type pendingWrites struct {
	mu      sync.Mutex
	pending map[types.UID]chan struct{}
}

// start registers a write for the claim; the returned function ends it.
func (p *pendingWrites) start(uid types.UID) func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending == nil {
		p.pending = map[types.UID]chan struct{}{}
	}
	ch := make(chan struct{})
	p.pending[uid] = ch
	return func() {
		p.mu.Lock()
		if p.pending[uid] == ch {
			delete(p.pending, uid)
		}
		p.mu.Unlock()
		close(ch)
	}
}

// wait waits until the claim's pending write, if any, is done (it is
// bounded by statusTimeout) or ctx ends.
func (p *pendingWrites) wait(ctx context.Context, uid types.UID) {
	p.mu.Lock()
	ch := p.pending[uid]
	p.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// recordDeviceStatus writes the claim's status.devices entries (KEP-4817)
// for devices whose identity exists only since Prepare (MIG devices created
// on demand) and is published nowhere else; other devices carry theirs as
// a slice attribute, so most claims cost no extra API write. A failure is
// logged, not returned: the status serves monitoring, and an API server or
// RBAC without it must not keep pods from starting.
func (d *Driver) recordDeviceStatus(ctx context.Context, claim *resourceapi.ResourceClaim, devices []claimstate.Device) {
	d.statusWrites.wait(ctx, claim.UID)
	statuses := make([]devicestatus.Device, 0, len(devices))
	seen := map[string]bool{}
	for _, cd := range devices {
		key := cd.Name + "@" + cd.ShareID
		if seen[key] {
			continue
		}
		seen[key] = true
		statuses = append(statuses, devicestatus.Device{Pool: cd.Pool, Name: cd.Name, ShareID: cd.ShareID, UUID: cd.UUID, ParentUUID: cd.ParentUUID})
	}
	if err := d.status.Record(ctx, claim, statuses); err != nil {
		klog.FromContext(ctx).Error(err, "Writing the claim's device status (status.devices); the devices are prepared all the same")
	}
}
