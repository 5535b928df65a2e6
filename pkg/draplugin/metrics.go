package draplugin

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/hardware"
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
			var inv *hardware.Inventory
			if pub := d.state.Load(); pub != nil {
				inv = pub.Inventory
			}
			if missingMIG(state, inv) {
				// A MIG device created at Prepare is in no published
				// inventory until the next discovery; its GPU instance
				// ID, which DCGM exporter's series carry, is read now.
				if fresh, err := d.cfg.Hardware.Discover(ctx); err == nil {
					inv = fresh
				}
			}
			for _, uid := range slices.Sorted(maps.Keys(state.Claims)) {
				if c := state.Claims[uid]; c.Phase == claimstate.PrepareCompleted {
					s.PreparedClaims++
					s.PreparedDevices = append(s.PreparedDevices, preparedDevices(c, inv)...)
				}
			}
		}
		// After the read, which looks at the directory again.
		s.AdoptionPending = d.store.NeedsAdoption()
	}
	return s
}

// preparedDevices are the info series of a prepared claim: one per
// device, consumer (pod or PodGroup) and request. A MIG device's GPU
// instance ID comes from the inventory; a device that shows nowhere in it
// (a GPU lost since) keeps its UUIDs.
func preparedDevices(c *claimstate.Claim, inv *hardware.Inventory) []metrics.PreparedDevice {
	var users []claimstate.Consumer
	for _, u := range c.Consumers {
		if u.IsPod() || u.IsPodGroup() {
			users = append(users, u)
		}
	}
	if len(users) == 0 {
		users = []claimstate.Consumer{{}}
	}
	var out []metrics.PreparedDevice
	for _, dev := range c.Devices {
		d := metrics.PreparedDevice{Namespace: c.Namespace, Claim: c.Name, Device: dev.Name, GPUUUID: dev.UUID}
		if dev.ParentUUID != "" {
			d.GPUUUID, d.MIGUUID = dev.ParentUUID, dev.UUID
			if m := inv.MIGDevice(dev.UUID); m != nil {
				d.GPUInstanceID = strconv.Itoa(m.GIID)
			}
		}
		requests := dev.Requests
		if len(requests) == 0 {
			requests = []string{""}
		}
		for _, u := range users {
			d.Pod, d.PodGroup = u.Name, ""
			if u.IsPodGroup() {
				d.Pod, d.PodGroup = "", u.Name
			}
			for _, r := range requests {
				d.Request = r
				out = append(out, d)
			}
		}
	}
	return out
}

// missingMIG says whether a prepared claim holds a MIG device that the
// inventory does not list.
func missingMIG(state *claimstate.State, inv *hardware.Inventory) bool {
	for _, c := range state.Claims {
		for _, dev := range c.Devices {
			if c.Phase == claimstate.PrepareCompleted && dev.ParentUUID != "" && inv.MIGDevice(dev.UUID) == nil {
				return true
			}
		}
	}
	return false
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
