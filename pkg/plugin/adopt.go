package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/checkpoint"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
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
		// The claim's MPS daemon, if it has one, is the daemon of its UID:
		// the adopted record owns it, so Unprepare stops it.
		var sharing *claimstate.Sharing
		if d.cfg.MPS != nil {
			if _, err := os.Stat(d.cfg.MPS.Dirs(uid).Root); err == nil {
				sharing = &claimstate.Sharing{MPSDaemon: uid}
			}
		}
		devices := make([]claimstate.Device, 0, len(names))
		for _, name := range names {
			device, shareID := splitShareName(name)
			cd := claimstate.Device{
				Pool:         d.cfg.NodeName,
				Name:         device,
				ShareID:      shareID,
				CDIDeviceIDs: []string{cdi.DeviceID(d.cfg.DriverName, uid, name)},
			}
			if sharing != nil {
				sh := *sharing
				cd.Sharing = &sh
			}
			devices = append(devices, cd)
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

// shareIDSuffix matches a CDI device name of a share: the device name and
// the share ID the allocator made, a UUID (see cdi.ShareName).
var shareIDSuffix = regexp.MustCompile(`^(.+)-([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$`)

// splitShareName splits the name of a claim's CDI device into the device
// name and the share ID, "" for a device allocated whole.
func splitShareName(name string) (device, shareID string) {
	if m := shareIDSuffix.FindStringSubmatch(name); m != nil {
		return m[1], m[2]
	}
	return name, ""
}

// rebuildMIGOwnership runs after the checkpoint was lost, in dynamic MIG
// mode: it finds which existing MIG instances are gpudra's from what
// survives elsewhere, so that they are neither destroyed nor mistaken for
// an operator's. An instance is gpudra's when a claim allocated from this
// node's pool (in the API server) or a claim's CDI spec on the node names
// the dynamic MIG device at exactly its profile and placement; the claim is
// then adopted with that instance. Anything else stays unknown: kept, and
// its GPU left out (see [Driver.buildModel]).
func (d *Driver) rebuildMIGOwnership(ctx context.Context, inv *hardware.Inventory) error {
	logger := klog.FromContext(ctx)
	full, err := devicemodel.Build(inv, devicemodel.WithDynamicMIG())
	if err != nil {
		return fmt.Errorf("build device model: %w", err)
	}
	// dynamicDevice resolves a device name to its record, if it is a
	// dynamic MIG device whose instance exists.
	dynamicDevice := func(cd *claimstate.Device) bool {
		dev, ok := full.Lookup(cd.Name)
		if !ok || dev.Placement == nil {
			return false
		}
		cd.ParentUUID = dev.GPU.UUID
		cd.DynamicMIG = dynamicRecord(dev)
		m := instanceAt(inv, recordKey(cd))
		if m == nil {
			cd.DynamicMIG = nil
			return false
		}
		fillCreated(cd, m)
		return true
	}

	var fromAPI []*resourceapi.ResourceClaim
	callCtx, cancel := context.WithTimeout(ctx, apiCallTimeout)
	list, listErr := d.cfg.KubeClient.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(callCtx, metav1.ListOptions{})
	cancel()
	if listErr != nil {
		listErr = fmt.Errorf("list ResourceClaims: %w", listErr)
	} else {
		for i := range list.Items {
			if list.Items[i].Status.Allocation != nil {
				fromAPI = append(fromAPI, &list.Items[i])
			}
		}
	}

	now := d.now()
	var adopted []string
	err = d.store.Update(ctx, func(s *claimstate.State) error {
		adopted = adopted[:0]
		// Claims adopted from their CDI specs know their devices by name.
		for uid, c := range s.Claims {
			if !c.Adopted || hasDynamicMIG(c.Devices) {
				continue
			}
			rec := c.Clone()
			found := false
			for i := range rec.Devices {
				found = dynamicDevice(&rec.Devices[i]) || found
			}
			if found {
				s.Claims[uid] = rec
				adopted = append(adopted, uid)
			}
		}
		// Claims the API server has allocated from this pool.
		for _, claim := range fromAPI {
			uid := string(claim.UID)
			if s.Claims[uid] != nil {
				continue
			}
			intent, err := d.intentOf(claim)
			if err != nil {
				continue
			}
			found := false
			for i := range intent.Devices {
				found = dynamicDevice(&intent.Devices[i]) || found
			}
			if !found || !s.Adopt(uid, intent.Devices, now) {
				continue
			}
			rec := s.Claims[uid]
			rec.Namespace, rec.Name, rec.Consumers = claim.Namespace, claim.Name, intent.Consumers
			adopted = append(adopted, uid)
		}
		return nil
	})
	if err != nil {
		return errors.Join(listErr, fmt.Errorf("record adopted MIG instances: %w", err))
	}
	if len(adopted) > 0 {
		slices.Sort(adopted)
		logger.Info("Adopted claims holding MIG instances gpudra created before the checkpoint was lost", "claimUIDs", adopted)
	}
	return listErr
}
