// Package sharing publishes full GPUs for several claims at once
// (fractional GPUs, --sharing: KEP-5075 consumable capacity) and reads
// what the time-slicing and MPS configurators need of a device's sharing:
// its config's sharing settings and, for a share, the caps it consumed.
// The caps themselves are enforced by the MPS configurator.
package sharing

import (
	"fmt"
	"sync/atomic"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// Publisher publishes the node's full GPUs shareable.
type Publisher struct {
	mode devicemodel.Sharing
	// on says whether full GPUs are published for sharing now (it stops
	// when the API server lacks consumable capacity).
	on atomic.Bool
}

var (
	_ preparer.Publisher        = &Publisher{}
	_ preparer.FallbackProvider = &Publisher{}
)

// NewPublisher returns the publisher of the node's sharing mode.
func NewPublisher(mode devicemodel.Sharing) (*Publisher, error) {
	if err := mode.Validate(); err != nil {
		return nil, err
	}
	p := &Publisher{mode: mode}
	p.on.Store(mode.Enabled())
	return p, nil
}

// Publish implements [preparer.Publisher].
func (p *Publisher) Publish(in *preparer.PublishInput) {
	if p.on.Load() {
		in.Options = append(in.Options, devicemodel.WithSharing(p.mode))
	}
}

// Fallbacks implements [preparer.FallbackProvider].
func (p *Publisher) Fallbacks() []preparer.Fallback {
	return []preparer.Fallback{{
		Feature: "DRAConsumableCapacity", On: &p.on,
		Log:    "The API server lacks consumable capacity (DRAConsumableCapacity): publishing full GPUs unshared instead of --sharing=" + p.mode.String(),
		Reason: "GPUSharingUnavailable",
		Event:  fmt.Sprintf("The API server dropped the consumable capacity of shared GPUs (DRAConsumableCapacity off): gpudra publishes the GPUs unshared instead of --sharing=%s", p.mode),
	}}
}

// Settings returns the sharing strategy of a resolved config, with its
// time-slicing and MPS settings.
func Settings(c v1beta1.Config) (v1beta1.SharingStrategy, *v1beta1.TimeSlicingConfig, *v1beta1.MpsConfig) {
	switch c := c.(type) {
	case *v1beta1.GpuConfig:
		if c.Sharing != nil {
			return c.Sharing.Strategy, c.Sharing.TimeSlicingConfig, c.Sharing.MpsConfig
		}
	case *v1beta1.MigDeviceConfig:
		if c.Sharing != nil {
			return c.Sharing.Strategy, nil, c.Sharing.MpsConfig
		}
	}
	return "", nil, nil
}

// ShareLimits returns the caps of a fractional share: capped is false for
// a device that is not a share of a shared GPU, or whose share has no cap
// (unlimited sharing without memory asked for).
func ShareLimits(d *preparer.Device) (capped bool, _ devicemodel.ShareLimits, _ error) {
	if d.State.ShareID == "" {
		return false, devicemodel.ShareLimits{}, nil
	}
	if !d.Model.Sharing.Enabled() {
		// Allocated as a share while the device was published shareable
		// (before a --sharing change or a fallback): its caps, if it had
		// any, are unknown now, and an uncapped share beside others would
		// break what the claim was promised.
		return false, devicemodel.ShareLimits{}, fmt.Errorf("share %s of device %s: the device is not published for sharing on this node now (--sharing, or the API server lacks consumable capacity); its caps cannot be applied, so it is refused", d.State.ShareID, d.State.Name)
	}
	limits, err := d.Model.ShareLimits(d.Config.Result.ConsumedCapacity)
	if err != nil {
		return false, limits, fmt.Errorf("share %s: %w", d.State.ShareID, err)
	}
	return limits.PinnedMemoryBytes > 0 || limits.ActiveThreadPercentage > 0, limits, nil
}
