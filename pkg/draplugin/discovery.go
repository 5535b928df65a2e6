package draplugin

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/checkpoint"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// Retry delays while discovery fails: GPUs that are bound late or a driver
// that loads late should show up within seconds, without hammering NVML.
const (
	minRetryDelay = 2 * time.Second
	maxRetryDelay = 30 * time.Second
	// pendingDelay is how often discovery runs while the publication waits
	// for something that ends by itself (a pending notice: an NVLink
	// fabric still registering at boot), so that the devices come within
	// seconds of it, not a discovery interval later.
	pendingDelay = 2 * time.Second
)

// discover runs one discovery and, if it succeeds, installs the result.
func (d *Driver) discover(ctx context.Context) error {
	inv, err := d.cfg.Hardware.Discover(ctx)
	if err != nil {
		return err
	}
	return d.install(ctx, inv)
}

// install derives the devices from an inventory and makes them current.
// The publishing rules are preparer.Publish's, fed the prepared claims; a
// checkpoint that cannot be read (a newer plugin wrote it) is passed as
// unknown, and the features decide what that means for them.
func (d *Driver) install(ctx context.Context, inv *hardware.Inventory) error {
	state, err := d.store.Read(ctx)
	if err != nil {
		klog.FromContext(ctx).V(2).Info("Publishing without the prepared claims: the checkpoint cannot be read", "err", err)
		state = nil
	}
	previous := d.state.Load()
	var prevInv *hardware.Inventory
	if previous != nil {
		prevInv = previous.Inventory
	}
	pub, err := preparer.Publish(d.features.Build, inv, prevInv, state, d.features.Publishers)
	if err != nil {
		return err
	}
	d.healthMon.remember(pub)
	d.state.Store(pub)
	d.installed.Store(&installInput{pub: pub, state: state})
	if previous == nil || !slices.EqualFunc(previous.Model.Devices, pub.Model.Devices, func(a, b devicemodel.Device) bool { return a.Name() == b.Name() }) {
		d.healthMon.signal.notify()
	}
	d.events.reportProblems(ctx, prevInv, inv)
	d.events.reportUnread(ctx, prevInv, inv)
	var before []preparer.Notice
	if previous != nil {
		before = previous.Notices
	}
	d.events.reportNotices(ctx, before, pub.Notices)
	return nil
}

// installInput is what install derived a publication from besides the
// features' own state (health, fallbacks), whose changes ask for a
// rebuild.
type installInput struct {
	// pub is the publication made; state the checkpoint's state it was
	// made with (nil when that could not be read).
	pub   *preparer.Published
	state *claimstate.State
}

// unchanged reports whether a publication from inv would be the current
// one: the hardware snapshot and the prepared claims are what the current
// publication was made from, and it left nothing out (whose logs every
// discovery repeats). Comparing these small plain structs is much
// cheaper than building the ResourceSlices again and comparing them,
// which a node otherwise does every discovery interval for nothing.
func (in *installInput) unchanged(ctx context.Context, current *preparer.Published, inv *hardware.Inventory, store *checkpoint.Store) bool {
	if in == nil || in.pub != current || in.state == nil || len(inv.Problems) > 0 || len(in.pub.Notices) > 0 {
		return false
	}
	if !reflect.DeepEqual(inv, in.pub.Inventory) {
		return false
	}
	state, err := store.Read(ctx)
	return err == nil && reflect.DeepEqual(state, in.state)
}

// publish hands the current devices to the ResourceSlice controller. The
// first time, before the helper starts the controller, the plugin creates
// the slices itself (publishFirst), a second sooner.
func (d *Driver) publish(ctx context.Context) error {
	res := d.current().Model.DriverResources(d.cfg.NodeName)
	if !d.controllerStarted {
		d.publishFirst(ctx, res)
		d.controllerStarted = true
	}
	if err := d.helper.PublishResources(ctx, res); err != nil {
		return fmt.Errorf("publish ResourceSlices: %w", err)
	}
	d.published.Store(true)
	return nil
}

// discoveryLoop discovers the GPUs again and again, republishing when the
// devices change; while the publication waits for something that ends by
// itself (a pending notice) it discovers every few seconds. While
// discovery fails it retries with backoff and keeps
// the last good devices (an empty pool if there never were any): a transient
// NVML error must not withdraw devices that running pods hold.
func (d *Driver) discoveryLoop(ctx context.Context, lastErr error) {
	logger := klog.FromContext(ctx)
	// Never retry less often than discovery runs when it works.
	minDelay := min(minRetryDelay, d.cfg.DiscoveryInterval)
	maxDelay := min(maxRetryDelay, d.cfg.DiscoveryInterval)
	delay := minDelay
	d.events.discoveryFailed(logger, lastErr, nil, len(d.current().Model.Devices), delay)
	for {
		wait := d.cfg.DiscoveryInterval
		switch {
		case lastErr != nil:
			wait = delay
		case preparer.HasPending(d.current().Notices):
			wait = min(pendingDelay, d.cfg.DiscoveryInterval)
		}
		rebuild := false
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		case <-d.rebuild:
			rebuild = true
		}
		inv, err := d.cfg.Hardware.Discover(ctx)
		if err == nil && !rebuild && lastErr == nil && d.installed.Load().unchanged(ctx, d.state.Load(), inv, d.store) {
			d.unchangedDiscoveries.Add(1)
			continue
		}
		before := d.current().Model.DriverResources(d.cfg.NodeName)
		if err == nil {
			err = d.install(ctx, inv)
		}
		if err != nil {
			if lastErr == nil {
				delay = minDelay
			} else {
				delay = min(2*delay, maxDelay)
			}
			d.events.discoveryFailed(logger, err, lastErr, len(d.current().Model.Devices), delay)
			lastErr = err
			continue
		}
		if lastErr != nil {
			logger.Info("GPU discovery works again", "devices", len(d.current().Model.Devices))
			d.Event(corev1.EventTypeNormal, "GPUDiscoveryRecovered", fmt.Sprintf("GPU discovery works again: %d devices", len(d.current().Model.Devices)))
		}
		lastErr = nil
		if after := d.current().Model.DriverResources(d.cfg.NodeName); rebuild || !equality.Semantic.DeepEqual(before, after) {
			logger.Info("Devices changed; republishing", "devices", len(d.current().Model.Devices))
			if err := d.publish(ctx); err != nil {
				logger.Error(err, "Republishing devices")
			}
		}
	}
}
