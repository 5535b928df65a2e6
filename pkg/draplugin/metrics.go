package draplugin

import (
	"context"
	"errors"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/metrics"
)

// metricsReadTimeout bounds the checkpoint read of a scrape: a commit
// held up by a slow disk must not hold a scrape for long.
const metricsReadTimeout = 2 * time.Second

// Metrics returns the plugin's metrics, to be served over HTTP.
func (d *Driver) Metrics() *metrics.Plugin { return d.metrics }

// metricsState is what the gauges show, read at each scrape.
func (d *Driver) metricsState() metrics.State {
	s := metrics.State{PreparedClaims: -1, PublishedDevices: map[string]int{}, TaintedDevices: map[string]int{}}
	if pub := d.state.Load(); pub != nil && pub.Model != nil {
		for i := range pub.Model.Devices {
			dev := &pub.Model.Devices[i]
			s.PublishedDevices[string(dev.Kind)]++
			// The strongest effect counts: NoExecute implies NoSchedule.
			effect := ""
			for _, t := range dev.API.Taints {
				if effect != string(resourceapi.DeviceTaintEffectNoExecute) {
					effect = string(t.Effect)
				}
			}
			if effect != "" {
				s.TaintedDevices[effect]++
			}
		}
	}
	if d.cfg.MPS != nil {
		s.MPSDaemons = len(d.cfg.MPS.Supervised())
	}
	if d.store != nil {
		s.CheckpointWrites, s.CheckpointWriteErrors = d.store.Writes(), d.store.WriteErrors()
		ctx, cancel := context.WithTimeout(context.Background(), metricsReadTimeout)
		defer cancel()
		if state, err := d.store.Read(ctx); err == nil {
			s.PreparedClaims = 0
			for _, c := range state.Claims {
				if c.Phase == claimstate.PrepareCompleted {
					s.PreparedClaims++
				}
			}
		}
	}
	return s
}

// Ready reports whether the plugin serves the node: registered with the
// kubelet and its devices handed to the ResourceSlice controller. The error
// says what is missing, for the readiness probe's answer.
func (d *Driver) Ready() error {
	if d.helper == nil {
		return errors.New("not started")
	}
	if st := d.helper.RegistrationStatus(); st == nil || !st.PluginRegistered {
		reason := "the kubelet has not registered the plugin yet"
		if st != nil && st.Error != "" {
			reason = "the kubelet refused the registration: " + st.Error
		}
		return errors.New(reason)
	}
	if !d.published.Load() {
		return errors.New("the devices are not published yet")
	}
	return nil
}
