package plugin

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/checkpoint"
	"github.com/gpudra/gpudra/pkg/claimstate"
)

// onCorruptCheckpoint is called by the checkpoint store, on its own
// goroutine, when the file turns out unreadable while the plugin runs. The
// store goes on empty; the sweep goroutine adopts the claims whose specs
// are still on the node before it removes any spec.
func (d *Driver) onCorruptCheckpoint(cf checkpoint.CorruptFile) {
	d.logger.Error(cf.Err, "Checkpoint became unreadable; moved aside. Claims with a CDI spec on this node will be adopted", "movedTo", cf.Path)
	d.event(corev1.EventTypeWarning, "CheckpointUnreadable",
		fmt.Sprintf("gpudra checkpoint was unreadable and was moved to %s: %v", cf.Path, cf.Err))
	d.adoptPending.Store(true)
	select {
	case d.adoptNow <- struct{}{}:
	default:
	}
}

// adoptSpecs records every claim that has a CDI spec but no record as
// prepared and adopted. After the checkpoint was lost, such a spec may
// belong to a running pod: removing it would break the pod's container
// restarts and free its devices for another claim. An adopted claim keeps
// its devices until the kubelet unprepares it or the sweep finds it gone.
func (d *Driver) adoptSpecs(ctx context.Context) error {
	uids, err := d.cdi.ClaimUIDs()
	if err != nil {
		return err
	}
	found := map[string][]claimstate.Device{}
	for _, uid := range uids {
		names, err := d.cdi.DeviceNames(uid)
		if err != nil {
			// An unreadable spec still names the claim: hold the claim
			// with no devices rather than lose track of the spec.
			klog.FromContext(ctx).Error(err, "Adopting a claim whose CDI spec cannot be read; its devices are unknown", "claimUID", uid)
		}
		devices := make([]claimstate.Device, 0, len(names))
		for _, name := range names {
			devices = append(devices, claimstate.Device{
				Pool:         d.cfg.NodeName,
				Name:         name,
				CDIDeviceIDs: []string{cdi.DeviceID(d.cfg.DriverName, uid, name)},
			})
		}
		found[uid] = devices
	}
	if len(found) == 0 {
		return nil
	}
	now := d.now()
	var adopted []string
	err = d.store.Update(ctx, func(s *claimstate.State) error {
		adopted = adopted[:0]
		for uid, devices := range found {
			if s.Adopt(uid, devices, now) {
				adopted = append(adopted, uid)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("record adopted claims: %w", err)
	}
	if len(adopted) > 0 {
		klog.FromContext(ctx).Info("Adopted claims prepared on this node that the checkpoint no longer knew", "claimUIDs", adopted)
	}
	return nil
}
