package plugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/claimstate"
	"github.com/gpudra/gpudra/pkg/config"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/mps"
	"github.com/gpudra/gpudra/pkg/timeslice"
)

// mpsField is the path of a GpuConfig's or MigDeviceConfig's MPS settings;
// errors about them name it.
var mpsField = field.NewPath("sharing", "mpsConfig")

// errMPSConsumer refuses a second MPS claim for one pod; see
// checkMPSConsumers.
var errMPSConsumer = errors.New("one MPS daemon per pod")

// sharingPlan is what sharing one claim's devices takes, worked out from its
// configs before anything is set up. The intent's devices carry their part
// of it in Device.Sharing.
type sharingPlan struct {
	// daemon is the claim's MPS daemon, nil when no device uses MPS. A
	// container reaches one MPS daemon only (one pipe directory), so a
	// claim has at most one.
	daemon *daemonPlan
}

// daemonPlan is the MPS daemon of a claim, before its devices' UUIDs are
// known (a dynamic MIG device gets its UUID at Prepare).
type daemonPlan struct {
	id string
	// devices are the indexes, in the intent, of the devices it serves.
	devices []int
	// config is the claim's MPS config; nil when the daemon serves
	// fractional shares only.
	config *v1beta1.MpsConfig
	origin config.Origin
	// shares are the caps of the fractional shares it serves, by intent
	// index: what each share consumed of its GPU.
	shares map[int]devicemodel.ShareLimits
}

// planSharing reads the sharing settings of the claim's resolved configs
// (resolved[i] configures intent.Devices[i]) and records them in the
// intent's devices. It refuses what this node cannot carry out, naming the
// field.
func (d *Driver) planSharing(intent *claimstate.Intent, resolved []config.Device, devices []*devicemodel.Device) (*sharingPlan, error) {
	plan := &sharingPlan{}
	intervals := timeslice.New()
	claim := timeslice.Claim{UID: intent.UID, Namespace: intent.Namespace, Name: intent.Name}
	for i := range resolved {
		rd := &resolved[i]
		cd := &intent.Devices[i]
		if cd.AdminAccess {
			// Admin access (monitoring) must not change how the device is
			// shared with the claims that use it.
			continue
		}
		strategy, ts, mpsConfig := sharingSettings(rd.Config)
		capped, limits, err := shareLimits(cd, devices[i], rd.Result.ConsumedCapacity)
		if err != nil {
			return nil, err
		}
		if capped {
			// A fractional share's caps are enforced by an MPS daemon of
			// its own, whatever the config says, unless the config asks
			// for another strategy, which cannot enforce them.
			if strategy == v1beta1.TimeSlicingStrategy {
				return nil, fmt.Errorf("device %s: %s: sharing.strategy TimeSlicing: the device is a share of a GPU shared by %s, whose caps only MPS enforces; allowed here: sharing.strategy MPS, or no sharing setting",
					cd.Name, rd.Origin, devices[i].Sharing)
			}
			if d.cfg.MPS == nil {
				return nil, fmt.Errorf("device %s: share %s of a GPU shared by %s is capped through an MPS daemon, but this node cannot run MPS daemons (%s)",
					cd.Name, cd.ShareID, devices[i].Sharing, d.mpsUnavailable())
			}
			if err := plan.addToDaemon(intent.UID, i, mpsConfig, rd.Origin, strategy == v1beta1.MpsStrategy); err != nil {
				return nil, fmt.Errorf("device %s: %w", cd.Name, err)
			}
			plan.daemon.shares[i] = limits
			cd.Sharing = &claimstate.Sharing{MPSDaemon: plan.daemon.id}
			continue
		}
		switch strategy {
		case "":
			continue
		case v1beta1.TimeSlicingStrategy:
			if rd.Kind == config.MIG {
				// A MIG device's time slice cannot be tuned: its containers
				// share it with the driver's scheduling, nothing to set.
				continue
			}
			if d.cfg.TimeSlicer == nil {
				return nil, fmt.Errorf("device %s: %s: sharing.strategy %s: this node cannot set time slices (%s); allowed here: no sharing setting%s",
					cd.Name, rd.Origin, strategy, d.timeSlicingUnavailable(), d.mpsAllowedHint())
			}
			interval := v1beta1.DefaultTimeSlice
			if ts != nil && ts.Interval != nil {
				interval = *ts.Interval
			}
			// One claim must not ask for two intervals on one GPU.
			if _, err := intervals.Acquire(cd.UUID, claim, interval); err != nil {
				return nil, fmt.Errorf("device %s: %s: %w", cd.Name, rd.Origin, err)
			}
			cd.Sharing = &claimstate.Sharing{TimeSlice: string(interval)}
		case v1beta1.MpsStrategy:
			if d.cfg.MPS == nil {
				return nil, fmt.Errorf("device %s: %s: sharing.strategy MPS: this node cannot run MPS daemons (%s); allowed here: no sharing setting%s",
					cd.Name, rd.Origin, d.mpsUnavailable(), d.timeSlicingAllowedHint())
			}
			if err := plan.addToDaemon(intent.UID, i, mpsConfig, rd.Origin, true); err != nil {
				return nil, fmt.Errorf("device %s: %w", cd.Name, err)
			}
			cd.Sharing = &claimstate.Sharing{MPSDaemon: plan.daemon.id}
		}
	}
	if plan.daemon != nil {
		if p := plan.daemon.config; p != nil && p.DefaultActiveThreadPercentage != nil && *p.DefaultActiveThreadPercentage == 0 {
			return nil, fmt.Errorf("%s: %s: 0 would leave the clients no threads; MPS takes 1 to 100",
				plan.daemon.origin, mpsField.Child("defaultActiveThreadPercentage"))
		}
	}
	return plan, nil
}

// addToDaemon makes the claim's one MPS daemon serve intent device i.
// withConfig says that the device's config asks for MPS, so its MPS
// settings apply; two different MPS configs in one claim would need two
// daemons, and a container reaches only one.
func (p *sharingPlan) addToDaemon(claimUID string, i int, c *v1beta1.MpsConfig, origin config.Origin, withConfig bool) error {
	if p.daemon == nil {
		p.daemon = &daemonPlan{id: claimUID, shares: map[int]devicemodel.ShareLimits{}}
	}
	if withConfig {
		if p.daemon.config != nil && p.daemon.config != c {
			return fmt.Errorf("%s asks for an MPS daemon of its own, but %s already asks for one for this claim: a container reaches one MPS daemon, so a claim's MPS devices must share one config",
				origin, p.daemon.origin)
		}
		if p.daemon.config == nil {
			p.daemon.config, p.daemon.origin = c, origin
		}
	}
	p.daemon.devices = append(p.daemon.devices, i)
	return nil
}

// shareLimits returns the caps of a fractional share: capped is false for
// a device that is not a share of a shared GPU, or whose share has no cap
// (unlimited sharing without memory asked for).
func shareLimits(cd *claimstate.Device, dev *devicemodel.Device, consumed map[resourceapi.QualifiedName]resource.Quantity) (capped bool, _ devicemodel.ShareLimits, _ error) {
	if cd.ShareID == "" {
		return false, devicemodel.ShareLimits{}, nil
	}
	if !dev.Sharing.Enabled() {
		// Allocated as a share while the device was published shareable
		// (before a --sharing change or a fallback): its caps, if it had
		// any, are unknown now, and an uncapped share beside others would
		// break what the claim was promised.
		return false, devicemodel.ShareLimits{}, fmt.Errorf("share %s of device %s: the device is not published for sharing on this node now (--sharing, or the API server lacks consumable capacity); its caps cannot be applied, so it is refused", cd.ShareID, cd.Name)
	}
	limits, err := dev.ShareLimits(consumed)
	if err != nil {
		return false, limits, fmt.Errorf("share %s: %w", cd.ShareID, err)
	}
	return limits.PinnedMemoryBytes > 0 || limits.ActiveThreadPercentage > 0, limits, nil
}

// sharingSettings returns the sharing strategy of a resolved config, with
// its time-slicing and MPS settings.
func sharingSettings(c v1beta1.Config) (v1beta1.SharingStrategy, *v1beta1.TimeSlicingConfig, *v1beta1.MpsConfig) {
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

func (d *Driver) timeSlicingUnavailable() string {
	return "no nvidia-smi: see --nvidia-smi-path"
}

func (d *Driver) mpsUnavailable() string {
	if d.cfg.MPSUnavailable != "" {
		return d.cfg.MPSUnavailable
	}
	return "no MPS control binary: see --mps-control-binary"
}

func (d *Driver) mpsAllowedHint() string {
	if d.cfg.MPS != nil {
		return ", sharing.strategy MPS"
	}
	return ""
}

func (d *Driver) timeSlicingAllowedHint() string {
	if d.cfg.TimeSlicer != nil {
		return ", sharing.strategy TimeSlicing"
	}
	return ""
}

// mpsSpec is the spec of the claim's MPS daemon, once every device it
// serves has its UUID.
func mpsSpec(p *daemonPlan, intent *claimstate.Intent) (mps.Spec, error) {
	spec := mps.Spec{ID: p.id}
	for _, i := range p.devices {
		cd := &intent.Devices[i]
		if cd.UUID == "" {
			return mps.Spec{}, fmt.Errorf("MPS daemon %s: device %s has no UUID yet", p.id, cd.Name)
		}
		if !slices.Contains(spec.DeviceUUIDs, cd.UUID) {
			spec.DeviceUUIDs = append(spec.DeviceUUIDs, cd.UUID)
		}
	}
	if err := p.applyShareCaps(&spec, intent); err != nil {
		return mps.Spec{}, err
	}
	c := p.config
	if c == nil {
		return spec, nil
	}
	lowerThreads(&spec, c.DefaultActiveThreadPercentage)
	spec.MultiUser = c.MultiUser
	limits := map[string]int64{}
	if q := c.DefaultPinnedDeviceMemoryLimit; q != nil {
		for _, uuid := range spec.DeviceUUIDs {
			limits[uuid] = q.Value()
		}
	}
	// Keys are a device's index among the devices the config applies to,
	// or its UUID.
	for _, key := range slices.Sorted(maps.Keys(c.DefaultPerDevicePinnedMemoryLimit)) {
		q := c.DefaultPerDevicePinnedMemoryLimit[key]
		uuid := key
		if n, err := strconv.Atoi(key); err == nil {
			if n < 0 || n >= len(spec.DeviceUUIDs) {
				return mps.Spec{}, fmt.Errorf("%s: %s: index %d is not one of the %d devices the config applies to (allowed: 0 to %d, or a device UUID)",
					p.origin, mpsField.Child("defaultPerDevicePinnedMemoryLimit").Key(key), n, len(spec.DeviceUUIDs), len(spec.DeviceUUIDs)-1)
			}
			uuid = spec.DeviceUUIDs[n]
		} else if !slices.Contains(spec.DeviceUUIDs, uuid) {
			return mps.Spec{}, fmt.Errorf("%s: %s: not the UUID of a device the config applies to (allowed: %v, or an index 0 to %d)",
				p.origin, mpsField.Child("defaultPerDevicePinnedMemoryLimit").Key(key), spec.DeviceUUIDs, len(spec.DeviceUUIDs)-1)
		}
		limits[uuid] = q.Value()
	}
	// A config's limits can lower a share's caps, never raise them.
	for uuid, capped := range spec.PinnedMemoryLimits {
		if l, ok := limits[uuid]; !ok || l > capped {
			limits[uuid] = capped
		}
	}
	if len(limits) > 0 {
		spec.PinnedMemoryLimits = limits
	}
	return spec, nil
}

// applyShareCaps sets the caps of the fractional shares the daemon serves:
// the pinned memory of each GPU is the sum of its shares' (two shares of
// one GPU in a claim are one client), and the thread percentage, which is
// one for the whole daemon, is the largest share's of any GPU; shares of
// one claim on GPUs with different compute caps are refused, since one
// daemon cannot cap them differently.
func (p *daemonPlan) applyShareCaps(spec *mps.Spec, intent *claimstate.Intent) error {
	if len(p.shares) == 0 {
		return nil
	}
	memory := map[string]int64{}
	threads := map[string]int{}
	for _, i := range slices.Sorted(maps.Keys(p.shares)) {
		uuid, caps := intent.Devices[i].UUID, p.shares[i]
		if caps.PinnedMemoryBytes > 0 {
			memory[uuid] += caps.PinnedMemoryBytes
		}
		threads[uuid] = min(threads[uuid]+caps.ActiveThreadPercentage, 100)
	}
	if len(memory) > 0 {
		spec.PinnedMemoryLimits = memory
	}
	var pct int
	for _, uuid := range slices.Sorted(maps.Keys(threads)) {
		t := threads[uuid]
		if pct != 0 && t != pct {
			return fmt.Errorf("MPS daemon %s: the claim's shares cap compute at %d%% on one GPU and %d%% on another, and one MPS daemon has one thread percentage: put shares with different compute in different claims", p.id, pct, t)
		}
		pct = t
	}
	if pct > 0 {
		spec.ActiveThreadPercentage = &pct
	}
	return nil
}

// lowerThreads applies a config's thread percentage, which can only lower
// a share's cap.
func lowerThreads(spec *mps.Spec, pct *int) {
	if pct == nil {
		return
	}
	if spec.ActiveThreadPercentage == nil || *pct < *spec.ActiveThreadPercentage {
		v := *pct
		spec.ActiveThreadPercentage = &v
	}
}

// timeSliceHolds returns the time-slice holds of a record, by GPU UUID.
func timeSliceHolds(c *claimstate.Claim) map[string]v1beta1.TimeSliceInterval {
	holds := map[string]v1beta1.TimeSliceInterval{}
	for _, cd := range c.Devices {
		if cd.Sharing != nil && cd.Sharing.TimeSlice != "" {
			holds[cd.UUID] = v1beta1.TimeSliceInterval(cd.Sharing.TimeSlice)
		}
	}
	return holds
}

// timeSlicePolicy rebuilds the node's time-slice holds from every record
// but the claim with UID except.
func timeSlicePolicy(s *claimstate.State, except string) (*timeslice.Policy, error) {
	var records []timeslice.Record
	for uid, c := range s.Claims {
		if uid == except {
			continue
		}
		for gpu, interval := range timeSliceHolds(c) {
			records = append(records, timeslice.Record{GPU: gpu, Claim: timeslice.Claim{UID: uid, Namespace: c.Namespace, Name: c.Name}, Interval: interval})
		}
	}
	return timeslice.Rebuild(records)
}

// checkTimeSlices refuses the intent when another claim holds one of its
// GPUs with another interval. It runs inside the checkpoint update that
// records the start, so two claims cannot both pass with different
// intervals.
func checkTimeSlices(s *claimstate.State, in claimstate.Intent) error {
	holds := timeSliceHolds(&claimstate.Claim{Devices: in.Devices})
	if len(holds) == 0 {
		return nil
	}
	policy, err := timeSlicePolicy(s, in.UID)
	if err != nil {
		return err
	}
	claim := timeslice.Claim{UID: in.UID, Namespace: in.Namespace, Name: in.Name}
	for _, gpu := range slices.Sorted(maps.Keys(holds)) {
		if _, err := policy.Acquire(gpu, claim, holds[gpu]); err != nil {
			return err
		}
	}
	return nil
}

// checkMPSConsumers refuses an MPS claim for a pod that already has
// another MPS claim on this node. A container reaches one MPS daemon (its
// one pipe directory); two claims' daemons in one container would leave it
// with whichever mount the runtime applied last. The plugin sees pods, not
// containers, so the refusal is per pod. It runs inside the checkpoint
// update that records the start, so of two such claims prepared at once
// exactly one is refused.
func checkMPSConsumers(s *claimstate.State, in claimstate.Intent) error {
	if len(mpsDaemons(&claimstate.Claim{Devices: in.Devices})) == 0 {
		return nil
	}
	for _, uid := range slices.Sorted(maps.Keys(s.Claims)) {
		other := s.Claims[uid]
		if uid == in.UID || len(mpsDaemons(other)) == 0 {
			continue
		}
		for _, pod := range in.Consumers {
			if slices.ContainsFunc(other.Consumers, func(c claimstate.Consumer) bool { return c.UID == pod.UID }) {
				return fmt.Errorf("%w: pod %s/%s already uses MPS claim %s/%s (uid %s) on this node, and a container reaches one MPS daemon (one pipe directory): put the pod's MPS devices in one claim",
					errMPSConsumer, in.Namespace, pod.Name, other.Namespace, other.Name, other.UID)
			}
		}
	}
	return nil
}

// lockTimeSlices takes the lock of time-slice changes when the claim sets
// or resets any; the returned function releases it. Every change of a
// GPU's time slice happens under it, so a reset by the last holder never
// lands after a new holder's setting (within this process; see
// docs/timeslicing.md for two plugin instances during a rolling update).
func (d *Driver) lockTimeSlices(c *claimstate.Claim) func() {
	if len(timeSliceHolds(c)) == 0 {
		return func() {}
	}
	// One lock for every GPU: time-slice changes are rare, and per-GPU
	// locks from a hashed key mutex could put two GPUs in one bucket and
	// deadlock a claim that holds both.
	d.timeSliceMu.Lock()
	return d.timeSliceMu.Unlock
}

// setTimeSlices applies the claim's intervals. Setting an interval the GPU
// has is harmless, so a joining claim sets it again: that heals a GPU whose
// setting was lost (a driver reload).
func (d *Driver) setTimeSlices(ctx context.Context, c *claimstate.Claim) error {
	holds := timeSliceHolds(c)
	for _, gpu := range slices.Sorted(maps.Keys(holds)) {
		if err := d.cfg.TimeSlicer.Set(ctx, gpu, holds[gpu]); err != nil {
			return fmt.Errorf("set time slice %s on GPU %s: %w", holds[gpu], gpu, err)
		}
	}
	return nil
}

// releaseTimeSlices puts the GPUs of which the claim is the last holder
// back to Default. The claim's record is still in the checkpoint; the
// caller holds the GPUs' locks and forgets the record afterwards, so a
// failed reset is tried again.
func (d *Driver) releaseTimeSlices(ctx context.Context, c *claimstate.Claim) error {
	holds := timeSliceHolds(c)
	if len(holds) == 0 {
		return nil
	}
	if d.cfg.TimeSlicer == nil {
		return fmt.Errorf("claim %s holds time slices on GPUs %v, but this node cannot set time slices now (%s)", c.UID, slices.Sorted(maps.Keys(holds)), d.timeSlicingUnavailable())
	}
	var others *timeslice.Policy
	err := d.store.View(ctx, func(s *claimstate.State) error {
		var err error
		others, err = timeSlicePolicy(s, c.UID)
		return err
	})
	if err != nil {
		return err
	}
	for _, gpu := range slices.Sorted(maps.Keys(holds)) {
		if _, held := others.InForce(gpu); held {
			continue
		}
		if err := d.cfg.TimeSlicer.Set(ctx, gpu, v1beta1.DefaultTimeSlice); err != nil {
			return fmt.Errorf("reset time slice of GPU %s to Default: %w", gpu, err)
		}
	}
	return nil
}

// startMPS starts the claim's MPS daemon and returns the CDI edits of the
// devices it serves, by intent index.
func (d *Driver) startMPS(ctx context.Context, p *daemonPlan, intent *claimstate.Intent) (map[int]*cdispec.ContainerEdits, error) {
	spec, err := mpsSpec(p, intent)
	if err != nil {
		return nil, err
	}
	daemon, err := d.cfg.MPS.Start(ctx, spec)
	if err != nil {
		return nil, err
	}
	edits := daemon.ContainerEdits()
	out := make(map[int]*cdispec.ContainerEdits, len(p.devices))
	for _, i := range p.devices {
		out[i] = edits
	}
	return out, nil
}

// mpsEdits returns the CDI edits of a prepared claim's MPS devices, by
// record index, from the daemons that serve them.
func (d *Driver) mpsEdits(c *claimstate.Claim) (map[int]*cdispec.ContainerEdits, error) {
	out := map[int]*cdispec.ContainerEdits{}
	for i, cd := range c.Devices {
		if cd.Sharing == nil || cd.Sharing.MPSDaemon == "" {
			continue
		}
		if d.cfg.MPS == nil {
			return nil, fmt.Errorf("device %s is served by MPS daemon %s, but this node cannot run MPS daemons now (%s)", cd.Name, cd.Sharing.MPSDaemon, d.mpsUnavailable())
		}
		out[i] = mps.Daemon{Dirs: d.cfg.MPS.Dirs(cd.Sharing.MPSDaemon)}.ContainerEdits()
	}
	return out, nil
}

// mpsDaemons returns the IDs of the MPS daemons a record names.
func mpsDaemons(c *claimstate.Claim) []string {
	var ids []string
	for _, cd := range c.Devices {
		if cd.Sharing != nil && cd.Sharing.MPSDaemon != "" && !slices.Contains(ids, cd.Sharing.MPSDaemon) {
			ids = append(ids, cd.Sharing.MPSDaemon)
		}
	}
	return ids
}

// tearDownSharing stops the claim's MPS daemons and resets the time slices
// it was the last to hold. It is idempotent; the caller forgets the record
// only once it succeeded.
func (d *Driver) tearDownSharing(ctx context.Context, c *claimstate.Claim) error {
	var errs []error
	for _, id := range mpsDaemons(c) {
		if d.cfg.MPS == nil {
			errs = append(errs, fmt.Errorf("stop MPS daemon %s: this node cannot run MPS daemons now (%s)", id, d.mpsUnavailable()))
			continue
		}
		if err := d.cfg.MPS.Stop(ctx, id); err != nil {
			errs = append(errs, err)
		}
	}
	unlock := d.lockTimeSlices(c)
	defer unlock()
	if err := d.releaseTimeSlices(ctx, c); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// hasSharing reports whether any device of the list is shared through
// time-slicing or MPS.
func hasSharing(devices []claimstate.Device) bool {
	for _, cd := range devices {
		if cd.Sharing != nil {
			return true
		}
	}
	return false
}

// restoreSharing runs at start: it applies the time slices held by the
// recorded claims again (the setting is lost when the driver reloads) and
// takes the recorded claims' MPS daemons under supervision, starting any
// that died. Failures are logged: the claims' records stay, and Prepare,
// Unprepare and the supervisor try again.
func (d *Driver) restoreSharing(ctx context.Context) {
	var records []*claimstate.Claim
	_ = d.store.View(ctx, func(s *claimstate.State) error {
		for _, c := range s.Claims {
			if hasSharing(c.Devices) {
				records = append(records, c.Clone())
			}
		}
		return nil
	})
	logger := klog.FromContext(ctx)
	for _, c := range records {
		if c.Phase != claimstate.PrepareCompleted {
			continue
		}
		if d.cfg.TimeSlicer != nil {
			unlock := d.lockTimeSlices(c)
			if err := d.setTimeSlices(ctx, c); err != nil {
				logger.Error(err, "Applying a prepared claim's time slices again", "claimUID", c.UID)
			}
			unlock()
		}
		for _, id := range mpsDaemons(c) {
			if d.cfg.MPS == nil {
				logger.Error(nil, "A prepared claim's MPS daemon cannot be supervised: this node cannot run MPS daemons now", "claimUID", c.UID, "mpsDaemon", id, "reason", d.mpsUnavailable())
				continue
			}
			if _, err := d.cfg.MPS.Adopt(ctx, id); err != nil {
				logger.Error(err, "Taking over a prepared claim's MPS daemon", "claimUID", c.UID, "mpsDaemon", id)
			}
		}
	}
}
