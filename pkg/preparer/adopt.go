package preparer

import (
	"context"
	"errors"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/checkpoint"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// view reads the state; when the checkpoint was found damaged, it first
// adopts what is prepared on the node, so that no decision is ever taken
// against the empty state a damaged file leaves.
func (p *Preparer) view(ctx context.Context, fn func(*claimstate.State) error) error {
	err := p.cfg.Store.View(ctx, fn)
	if !errors.Is(err, checkpoint.ErrNeedsAdoption) {
		return err
	}
	if err := p.AdoptIfNeeded(ctx, nil); err != nil {
		return fmt.Errorf("the checkpoint was lost and the claims prepared on this node could not be adopted yet (retry): %w", err)
	}
	return p.cfg.Store.View(ctx, fn)
}

// update is Store.Update with the same adoption as view.
func (p *Preparer) update(ctx context.Context, mutate func(*claimstate.State) error) error {
	err := p.cfg.Store.Update(ctx, mutate)
	if !errors.Is(err, checkpoint.ErrNeedsAdoption) {
		return err
	}
	if err := p.AdoptIfNeeded(ctx, nil); err != nil {
		return fmt.Errorf("the checkpoint was lost and the claims prepared on this node could not be adopted yet (retry): %w", err)
	}
	return p.cfg.Store.Update(ctx, mutate)
}

// Adopt records every claim prepared on the node that the checkpoint no
// longer knows, after the checkpoint was lost: the claims whose CDI specs
// are in the directory (with the records their specs carry), and whatever
// the configurators' adopters find (their work for claims the API server
// allocated here but whose specs were never written). Such a claim may belong to a running pod: removing its
// spec would break the pod's container restarts and free its devices for
// another claim. An adopted claim keeps its devices until the kubelet
// unprepares it or the sweep finds it gone. inv is the node's hardware;
// nil means the hardware as last discovered.
//
// Adopt clears the checkpoint's need for adoption only once the adopted
// claims are recorded; until then every Prepare and Unprepare tries again.
func (p *Preparer) Adopt(ctx context.Context, inv *hardware.Inventory) error {
	p.adoptMu.Lock()
	defer p.adoptMu.Unlock()
	return p.adopt(ctx, inv)
}

// AdoptIfNeeded is Adopt for callers that found the checkpoint lost (a
// refused call, the sweep): it adopts only if the checkpoint still needs
// it once no other adoption runs. Without that check, an adoption that
// waited for another one would list the claims' specs after the first
// adoption had made Prepare and Unprepare work again, and record as
// adopted a claim unprepared while it read the specs and asked the API
// server: its device would look held, and be refused to the next claim.
func (p *Preparer) AdoptIfNeeded(ctx context.Context, inv *hardware.Inventory) error {
	p.adoptMu.Lock()
	defer p.adoptMu.Unlock()
	if !p.cfg.Store.NeedsAdoption() {
		return nil
	}
	return p.adopt(ctx, inv)
}

// adopt is Adopt's work; the caller holds adoptMu.
func (p *Preparer) adopt(ctx context.Context, inv *hardware.Inventory) error {
	logger := klog.FromContext(ctx)
	if inv == nil {
		inv = p.cfg.Node.Inventory()
	}
	uids, err := p.cfg.CDI.PreparedClaimUIDs()
	if err != nil {
		return err
	}
	in := &Adoption{Inventory: inv, Claims: map[string]*claimstate.Claim{}}
	for _, uid := range uids {
		content, err := p.cfg.CDI.Read(uid)
		if err != nil {
			// An unreadable spec still names the claim: hold the claim
			// with what could be read rather than lose track of it.
			logger.Error(err, "Adopting a claim whose CDI spec cannot be read in full", "claimUID", uid)
		}
		c := &claimstate.Claim{UID: uid, Phase: claimstate.PrepareCompleted, Adopted: true, Records: content.Records}
		for _, name := range content.DeviceNames {
			device, allocID := cdi.SplitDeviceName(name)
			cd := claimstate.Device{
				Pool:         p.cfg.NodeName,
				Name:         device,
				ShareID:      allocID,
				CDIDeviceIDs: []string{cdi.DeviceID(p.cfg.DriverName, uid, name)},
			}
			for _, id := range content.Devices {
				if id.Name == device && id.ShareID == allocID {
					cd.UUID, cd.ParentUUID = id.UUID, id.ParentUUID
				}
			}
			c.Devices = append(c.Devices, cd)
		}
		in.Claims[uid] = c
	}
	allocated, allocErr := p.cfg.Node.Allocated(ctx)
	if allocErr == nil {
		in.Allocated = allocated
	}
	var errs []error
	for _, conf := range p.cfg.Configurators {
		if a, ok := conf.(Adopter); ok {
			if err := a.Adopt(ctx, in); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", conf.Name(), err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		// Something on the node may be unaccounted for: do not let the
		// checkpoint be used as if it were complete.
		return err
	}
	started, err := p.cfg.Store.Started()
	if err != nil {
		return err
	}
	for _, f := range started.Unreadable {
		logger.Error(f.Err, "A start record file cannot be read: what its preparation set up, if anything, is not undone", "file", f.Path)
	}
	now := p.cfg.Clock()
	var adopted, adoptedStarted []string
	var refused map[string]error
	err = p.cfg.Store.Recover(ctx, func(s *claimstate.State) error {
		adopted, adoptedStarted, refused = adopted[:0], adoptedStarted[:0], map[string]error{}
		for _, uid := range sortedKeys(in.Claims) {
			c := in.Claims[uid]
			if s.Adopt(uid, c.Devices, c.Records, now) {
				rec := s.Claims[uid]
				rec.Namespace, rec.Name, rec.Consumers = c.Namespace, c.Name, c.Consumers
				adopted = append(adopted, uid)
			}
		}
		for _, uid := range sortedKeys(started.Claims) {
			if s.Claims[uid] != nil {
				// Its CDI spec was written: the preparation got past
				// every Apply, and the spec's records own the setup.
				continue
			}
			if err := p.adoptStarted(s, started.Claims[uid]); err != nil {
				refused[uid] = err
				continue
			}
			adoptedStarted = append(adoptedStarted, uid)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("record adopted claims: %w", err)
	}
	if len(adopted) > 0 {
		logger.Info("Adopted claims prepared on this node that the checkpoint no longer knew", "claimUIDs", adopted)
	}
	if len(adoptedStarted) > 0 {
		logger.Info("Adopted preparations in progress when the checkpoint was lost; they are rolled back before they are prepared again, or by the sweep", "claimUIDs", adoptedStarted)
	}
	for _, uid := range sortedKeys(refused) {
		logger.Error(refused[uid], "A start record file names what a claim adopted from its CDI spec holds: not adopted, and what it set up, if anything, is not undone", "claimUID", uid)
	}
	if allocErr != nil {
		logger.Error(allocErr, "Adopted the claims with CDI specs; the API server's allocations could not be read, so work of claims without a spec stays unaccounted for")
	}
	return nil
}

// adoptStarted records the start record c, read from its file after the
// checkpoint was lost, as started, unless it names what a claim already in
// s holds: the guards of its records and the device conflicts are checked
// as at the start of a preparation.
func (p *Preparer) adoptStarted(s *claimstate.State, c *claimstate.Claim) error {
	if err := p.guard(s, c); err != nil {
		return err
	}
	in := claimstate.Intent{UID: c.UID, Namespace: c.Namespace, Name: c.Name, Consumers: c.Consumers, Devices: c.Devices, Records: c.Records}
	return s.RecordStarted(in, c.StartedAt)
}

// completeAdopted answers a Prepare of a claim adopted after the checkpoint
// was lost. Its devices are set up and may serve running containers, so
// nothing is set up again: the record learns what the spec could not tell
// (requests, admin access, the claim's name and pods) and stops being
// adopted.
func (p *Preparer) completeAdopted(ctx context.Context, claim *resourceapi.ResourceClaim, intent claimstate.Intent, adopted *claimstate.Claim) (*claimstate.Claim, error) {
	if !sameIdentity(adopted.Devices, intent.Devices) {
		return nil, fmt.Errorf("claim %s/%s (uid %s) was adopted after the checkpoint was lost with devices %v, not %v: unprepare it first",
			intent.Namespace, intent.Name, intent.UID, identities(adopted.Devices), identities(intent.Devices))
	}
	rec := adopted.Clone()
	rec.Adopted = false
	rec.Namespace, rec.Name, rec.Consumers = intent.Namespace, intent.Name, intent.Consumers
	for i := range rec.Devices {
		for _, want := range intent.Devices {
			if want.Name == rec.Devices[i].Name && want.ShareID == rec.Devices[i].ShareID {
				rec.Devices[i].Requests = want.Requests
				rec.Devices[i].AdminAccess = want.AdminAccess
				rec.Devices[i].CDIDeviceIDs = want.CDIDeviceIDs
			}
		}
	}
	err := p.cfg.Store.Update(ctx, func(s *claimstate.State) error {
		cur := s.Claims[rec.UID]
		if cur == nil || !cur.Adopted {
			return fmt.Errorf("claim %s changed while it was being completed; retry", rec.UID)
		}
		s.Claims[rec.UID] = rec
		return nil
	})
	if err != nil {
		return nil, err
	}
	klog.FromContext(ctx).Info("Prepare of an adopted claim: its devices are kept as they are", "devices", len(rec.Devices))
	if err := p.repairSpec(ctx, claim, rec); err != nil {
		return nil, err
	}
	return rec, nil
}

// adoptedSetupGone asks the configurators that can tell ([Checker])
// whether what an adopted claim's records name still exists, and returns
// the records that name something gone, with why.
func (p *Preparer) adoptedSetupGone(ctx context.Context, c *claimstate.Claim) map[string]error {
	inv := p.cfg.Node.Inventory()
	if d, ok := p.cfg.Node.(Discoverer); ok {
		if fresh, err := d.Discover(ctx); err == nil {
			inv = fresh
		}
	}
	if inv == nil {
		return nil
	}
	gone := map[string]error{}
	for _, conf := range p.cfg.Configurators {
		ch, ok := conf.(Checker)
		rec := c.Records[conf.Name()]
		if !ok || rec == nil {
			continue
		}
		if err := ch.Check(ctx, rec, inv); err != nil {
			gone[conf.Name()] = err
		}
	}
	return gone
}
