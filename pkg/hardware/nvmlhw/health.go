package nvmlhw

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// Health watching. NVML reports XID errors and ECC errors as events on an
// event set, with nothing when they clear; it reports a GPU that fell off
// the bus only as NVML_ERROR_GPU_IS_LOST on calls (also on the event
// set's wait); and on drivers that have it, the field
// NVML_FI_DEV_GET_GPU_RECOVERY_ACTION says what the GPU needs now (none,
// a GPU reset, a node reboot, a drain). So the watcher waits on an event
// set with a short timeout, so that it notices ctx ending, and polls each
// GPU every poll interval, and at once after a lost-GPU answer or a
// recovery-action event. An event set that can be interrupted
// ([InterruptibleEventSet], the simulated hardware's) also reports every
// change of a GPU's condition, so it is waited on without a timeout and
// interrupted when ctx ends; GPUs are polled only when something is due
// (a fault whose recovery is told by time, a GPU that cannot raise
// events, an enumeration that failed): a process that holds a thousand
// simulated nodes would otherwise wake every node's watcher every poll
// for nothing. The rules:
//
//   - a GPU whose call answers NVML_ERROR_GPU_IS_LOST is lost; when it
//     answers again it has recovered;
//   - after an XID or ECC event, the GPU has recovered when its recovery
//     action reads none: after it read something else (the reset or reboot
//     was done), or at a poll at least one poll interval after the last
//     event (the driver asks for nothing, as for an error contained to
//     one application). Where the field is not supported the GPU stays
//     unhealthy until the plugin restarts, as with NVIDIA's drivers.
//
// None of this can be exercised here without a GPU: the simulated
// hardware serves the same NVML calls (event set, field values, lost
// GPUs), so the loop below runs in the tests over it, and the pieces that
// map NVML's answers are unit tested with go-nvml's mocks.

// Defaults of [WithHealthPolling].
const (
	DefaultHealthPollInterval = 5 * time.Second
	DefaultHealthWaitTimeout  = time.Second
)

// WithHealthPolling sets how often the health watcher polls every GPU
// (lost, recovery action) and how long one wait on the event set lasts,
// which bounds how long WatchHealth takes to return once its context ends.
func WithHealthPolling(poll, wait time.Duration) Option {
	return func(o *options) { o.healthPoll, o.healthWait = poll, wait }
}

// InterruptibleEventSet is an event set whose Wait another goroutine can
// end early, and which reports every change of a registered GPU's
// condition: a lost GPU fails the wait, and a GPU that answers again or
// whose recovery action changes raises a recovery-action event. NVML's
// own is neither: nvmlEventSetWait returns only on an event or at its
// timeout, and a GPU may change without one.
type InterruptibleEventSet interface {
	nvml.EventSet
	// Interrupt makes the Wait in progress, and every later one, return
	// NVML_ERROR_TIMEOUT at once.
	Interrupt()
}

// healthEventMask are the NVML events watched. The recovery-action event
// (drivers that have it) only wakes a poll of its GPU.
const healthEventMask = uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeGpuRecoveryAction)

// noInstance is NVML's GPU and compute instance ID of an event that
// concerns no MIG device.
const noInstance = 0xFFFFFFFF

// WatchHealth implements [hardware.HealthWatcher]. It keeps NVML
// initialized while it runs (NVML counts initializations, so Discover and
// MIG operations go on beside it) and watches the GPUs NVML lists, also
// ones that appear later.
func (d *Discoverer) WatchHealth(ctx context.Context, out chan<- hardware.HealthEvent) error {
	d.mu.Lock()
	lib, err := d.initialized(ctx)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	defer func() {
		if ret := lib.Shutdown(); ret != nvml.SUCCESS {
			logger.Error(ret, "nvmlShutdown failed after watching GPU health")
		}
	}()
	set, ret := lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("watch GPU health: nvmlEventSetCreate: %w", ret)
	}
	defer func() {
		if ret := set.Free(); ret != nvml.SUCCESS {
			logger.Error(ret, "nvmlEventSetFree failed")
		}
	}()
	w := &healthWatch{lib: lib, set: set, poll: d.healthPoll, now: time.Now, gpus: map[string]*watchedGPU{}, logger: logger}
	w.run(ctx, d.healthWait, out)
	return nil
}

// healthWatch is the state of one WatchHealth.
type healthWatch struct {
	lib    nvml.Interface
	set    nvml.EventSet
	poll   time.Duration
	now    func() time.Time
	logger klog.Logger
	// lastPoll is when the last poll began; incomplete that it could not
	// enumerate every GPU NVML lists.
	lastPoll   time.Time
	incomplete bool
	// gpus by UUID, every GPU seen since the watch began.
	gpus map[string]*watchedGPU
}

// watchedGPU is what the watcher knows of one GPU.
type watchedGPU struct {
	uuid       string
	dev        nvml.Device
	registered bool
	// polledOnly: the GPU raises no recovery-action events (it cannot
	// tell which it supports, or registering failed), so only polls see
	// it change.
	polledOnly bool
	lost       bool
	// faulted: an XID or ECC event came, and no recovery since.
	faulted bool
	// lastFault is when the last one came; sawAction that the recovery
	// action read something other than none since.
	lastFault time.Time
	sawAction bool
}

func (w *healthWatch) run(ctx context.Context, wait time.Duration, out chan<- hardware.HealthEvent) {
	waitMS := uint32(max(wait, time.Millisecond) / time.Millisecond)
	send := func(events []hardware.HealthEvent) bool {
		for _, e := range events {
			select {
			case out <- e:
			case <-ctx.Done():
				return false
			}
		}
		return true
	}
	interruptible, eventDriven := w.set.(InterruptibleEventSet)
	if eventDriven {
		defer context.AfterFunc(ctx, interruptible.Interrupt)()
	}
	if !send(w.pollAll()) {
		return
	}
	nextPoll := w.now().Add(w.poll)
	for ctx.Err() == nil {
		if eventDriven {
			// Nothing due: wait for an event or the interrupt, as
			// long as NVML's wait can. Rounded up: a wait that ends
			// short of the poll would be followed by a second one of
			// a millisecond.
			nextPoll = w.due()
			waitMS = math.MaxUint32
			if !nextPoll.IsZero() {
				waitMS = uint32((min(max(nextPoll.Sub(w.now()), time.Millisecond), w.poll) + time.Millisecond - 1) / time.Millisecond)
			}
		}
		data, ret := w.set.Wait(waitMS)
		var events []hardware.HealthEvent
		pollNow := false
		switch ret {
		case nvml.SUCCESS:
			// The GPU is checked at once: after a fault, so that the
			// recovery action the driver asks for is read before it can
			// be carried out; after a recovery-action event, to see it.
			var g *watchedGPU
			events, g = w.fromEvent(data)
			if g != nil {
				events = append(events, w.check(g)...)
			}
			pollNow = g == nil
		case nvml.ERROR_TIMEOUT:
		case nvml.ERROR_GPU_IS_LOST:
			// Says that some GPU is lost, not which.
			pollNow = true
		default:
			w.logger.V(2).Info("Waiting for NVML events failed", "err", ret)
			select {
			case <-ctx.Done():
			case <-time.After(wait):
			}
		}
		if pollNow || (!nextPoll.IsZero() && !w.now().Before(nextPoll)) {
			events = append(events, w.pollAll()...)
			nextPoll = w.now().Add(w.poll)
		}
		if !send(events) {
			return
		}
	}
}

// due returns when the next poll of an event-driven watch is due, or the
// zero time when none is: every GPU raises events for every change, and
// no fault waits for its recovery to be told by time.
func (w *healthWatch) due() time.Time {
	var due time.Time
	at := func(t time.Time) {
		if due.IsZero() || t.Before(due) {
			due = t
		}
	}
	if w.incomplete {
		at(w.lastPoll.Add(w.poll))
	}
	for _, g := range w.gpus {
		switch {
		case g.polledOnly || !g.registered:
			at(w.lastPoll.Add(w.poll))
		case g.faulted && !g.sawAction && !g.lost:
			// Recovered at a poll one interval after the fault, if the
			// recovery action reads none then (see check).
			at(g.lastFault.Add(w.poll))
		}
	}
	return due
}

// fromEvent maps one NVML event to health events, and returns the GPU it
// came from (nil when it cannot be told).
func (w *healthWatch) fromEvent(data nvml.EventData) ([]hardware.HealthEvent, *watchedGPU) {
	g := w.gpuOf(data.Device)
	if g == nil {
		return nil, nil
	}
	e, ok := healthEventFrom(data, g.uuid, w.now())
	if !ok {
		return nil, g
	}
	if e.Kind == hardware.HealthXID || e.Kind == hardware.HealthECCDoubleBit {
		g.faulted, g.lastFault, g.sawAction = true, e.Time, false
	}
	return []hardware.HealthEvent{e}, g
}

// gpuOf finds the watched GPU of an event's device handle.
func (w *healthWatch) gpuOf(dev nvml.Device) *watchedGPU {
	if dev == nil {
		return nil
	}
	for _, g := range w.gpus {
		if g.dev == dev {
			return g
		}
	}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		return nil
	}
	return w.gpus[uuid]
}

// healthEventFrom maps an NVML event of the GPU with the given UUID to a
// health event; ok is false for events that are not one (a recovery
// action changing only wakes a poll).
func healthEventFrom(data nvml.EventData, gpuUUID string, at time.Time) (e hardware.HealthEvent, ok bool) {
	e = hardware.HealthEvent{GPUUUID: gpuUUID, Time: at, GIID: instanceID(data.GpuInstanceId), CIID: instanceID(data.ComputeInstanceId)}
	switch data.EventType {
	case nvml.EventTypeXidCriticalError:
		e.Kind, e.XID = hardware.HealthXID, data.EventData
	case nvml.EventTypeDoubleBitEccError:
		e.Kind = hardware.HealthECCDoubleBit
	default:
		return hardware.HealthEvent{}, false
	}
	return e, true
}

func instanceID(id uint32) int {
	if id == noInstance {
		return hardware.NoInstance
	}
	return int(id)
}

// pollAll looks for GPUs that appeared (and registers them for events),
// then checks every GPU seen.
func (w *healthWatch) pollAll() []hardware.HealthEvent {
	w.lastPoll = w.now()
	w.refresh()
	var out []hardware.HealthEvent
	for _, g := range w.gpus {
		out = append(out, w.check(g)...)
	}
	return out
}

// refresh enumerates the GPUs NVML lists now and registers the new ones
// (and ones that came back with a new handle) on the event set. GPUs it
// cannot read are left for the next poll; Discover reports them.
func (w *healthWatch) refresh() {
	w.incomplete = true
	count, ret := w.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return
	}
	w.incomplete = false
	for i := 0; i < count; i++ {
		dev, ret := w.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			w.incomplete = true
			continue
		}
		uuid, ret := dev.GetUUID()
		if ret != nvml.SUCCESS {
			w.incomplete = true
			continue
		}
		g := w.gpus[uuid]
		if g == nil {
			g = &watchedGPU{uuid: uuid}
			w.gpus[uuid] = g
		}
		if g.dev != dev {
			g.dev, g.registered = dev, false
		}
		if !g.registered {
			g.registered = w.register(g)
		}
	}
}

// register asks for g's health events. A GPU that supports none of them
// is still polled for being lost.
func (w *healthWatch) register(g *watchedGPU) bool {
	g.polledOnly = true
	supported, ret := g.dev.GetSupportedEventTypes()
	if ret != nvml.SUCCESS {
		w.logger.Info("Cannot tell which health events a GPU reports; it is polled only", "uuid", g.uuid, "err", ret)
		return true
	}
	if ret := g.dev.RegisterEvents(healthEventMask&supported, w.set); ret != nvml.SUCCESS {
		w.logger.Info("Cannot register for a GPU's health events; it is polled only", "uuid", g.uuid, "err", ret)
		return true
	}
	g.polledOnly = supported&nvml.EventTypeGpuRecoveryAction == 0
	return true
}

// check polls one GPU: lost, back, or recovered from its last fault.
func (w *healthWatch) check(g *watchedGPU) []hardware.HealthEvent {
	if g.dev == nil {
		return nil
	}
	now := w.now()
	action, ret := recoveryAction(g.dev)
	switch {
	case ret == nvml.ERROR_GPU_IS_LOST:
		if g.lost {
			return nil
		}
		g.lost = true
		return []hardware.HealthEvent{{GPUUUID: g.uuid, Kind: hardware.HealthGPULost, GIID: hardware.NoInstance, CIID: hardware.NoInstance, Time: now, Detail: ret.Error()}}
	case g.lost:
		g.lost, g.faulted = false, false
		return []hardware.HealthEvent{{GPUUUID: g.uuid, Kind: hardware.HealthRecovered, GIID: hardware.NoInstance, CIID: hardware.NoInstance, Time: now, Detail: "the GPU answers again"}}
	case !g.faulted || ret != nvml.SUCCESS:
		// Without the field, a fault stays until the plugin restarts.
		return nil
	case action != nvml.GPU_RECOVERY_ACTION_NONE:
		g.sawAction = true
		return nil
	case g.sawAction || now.Sub(g.lastFault) >= w.poll:
		g.faulted = false
		return []hardware.HealthEvent{{GPUUUID: g.uuid, Kind: hardware.HealthRecovered, GIID: hardware.NoInstance, CIID: hardware.NoInstance, Time: now, Detail: "recovery action none"}}
	}
	return nil
}

// recoveryAction reads NVML_FI_DEV_GET_GPU_RECOVERY_ACTION. The return is
// the call's or, if the call worked, the field's: NVML_ERROR_GPU_IS_LOST
// for a lost GPU, NVML_ERROR_NOT_SUPPORTED on drivers without the field.
func recoveryAction(dev nvml.Device) (nvml.DeviceGpuRecoveryAction, nvml.Return) {
	values := []nvml.FieldValue{{FieldId: nvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	if ret := dev.GetFieldValues(values); ret != nvml.SUCCESS {
		return 0, ret
	}
	if ret := nvml.Return(values[0].NvmlReturn); ret != nvml.SUCCESS {
		return 0, ret
	}
	return nvml.DeviceGpuRecoveryAction(fieldUint(values[0])), nvml.SUCCESS
}

// fieldUint decodes an integer field value (a C union, little-endian on
// the platforms NVML supports).
func fieldUint(v nvml.FieldValue) uint64 {
	switch nvml.ValueType(v.ValueType) {
	case nvml.VALUE_TYPE_UNSIGNED_SHORT:
		return uint64(binary.LittleEndian.Uint16(v.Value[:2]))
	case nvml.VALUE_TYPE_UNSIGNED_INT, nvml.VALUE_TYPE_SIGNED_INT:
		return uint64(binary.LittleEndian.Uint32(v.Value[:4]))
	default:
		return binary.LittleEndian.Uint64(v.Value[:])
	}
}
