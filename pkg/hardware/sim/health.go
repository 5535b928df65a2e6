package sim

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// Simulated GPU health. The fake NVML serves what nvmlhw's health watcher
// calls (an event set, registration for events, the recovery-action field)
// and answers NVML_ERROR_GPU_IS_LOST for a lost GPU, so the real watcher
// runs over it. [HealthEvents] injects what happens to the GPUs:
//
//	xid:<n>   an XID critical-error event; the GPU's recovery action turns
//	          to a GPU reset, as the driver asks after a fatal XID
//	ecc-dbe   a double-bit ECC event; recovery action a GPU reset
//	gpu-lost  the GPU falls off the bus: every call on it answers
//	          NVML_ERROR_GPU_IS_LOST, and event-set waits report it once
//	recover   the GPU answers again and needs nothing (recovery action
//	          none); a recovery-action event wakes the watchers
//
// The condition (lost, recovery action) is kept in the HealthEvents, not
// in one process's hardware, so that a plugin restarted over the same
// node sees the GPU as the one before it left it. XID and ECC events, as
// on a real node, reach only the event sets that exist when they happen.

// The health events of [HealthEvents.Inject] and [ParseHealthEvent].
const (
	InjectXID     = "xid"
	InjectECCDBE  = "ecc-dbe"
	InjectGPULost = "gpu-lost"
	InjectRecover = "recover"
)

// InjectKinds are the event kinds, as [ParseHealthEvent] spells them.
var InjectKinds = []string{InjectXID + ":<n>", InjectECCDBE, InjectGPULost, InjectRecover}

// HealthEvent is one event to inject into a simulated GPU.
type HealthEvent struct {
	// Kind is one of InjectXID, InjectECCDBE, InjectGPULost, InjectRecover.
	Kind string
	// XID is the XID number of an InjectXID event.
	XID uint64
	// MIG, if set, makes an XID or ECC event come from the MIG device
	// with these GPU and compute instance IDs on the GPU.
	MIG *MIGInstance
}

// MIGInstance names a MIG device by its GPU and compute instance IDs.
type MIGInstance struct {
	GI, CI int
}

// String renders e as ParseHealthEvent reads it.
func (e HealthEvent) String() string {
	s := e.Kind
	if e.Kind == InjectXID {
		s = fmt.Sprintf("%s:%d", InjectXID, e.XID)
	}
	if e.MIG != nil {
		s += fmt.Sprintf(" (GI %d, CI %d)", e.MIG.GI, e.MIG.CI)
	}
	return s
}

// ParseHealthEvent reads "xid:<n>", "ecc-dbe", "gpu-lost" or "recover".
func ParseHealthEvent(s string) (HealthEvent, error) {
	if n, ok := strings.CutPrefix(s, InjectXID+":"); ok {
		xid, err := strconv.ParseUint(n, 10, 32)
		if err != nil || xid == 0 {
			return HealthEvent{}, fmt.Errorf("health event %q: the XID must be a positive number, as in xid:79", s)
		}
		return HealthEvent{Kind: InjectXID, XID: xid}, nil
	}
	switch s {
	case InjectECCDBE, InjectGPULost, InjectRecover:
		return HealthEvent{Kind: s}, nil
	}
	return HealthEvent{}, fmt.Errorf("health event %q: must be one of %s", s, strings.Join(InjectKinds, ", "))
}

// ErrNotWatched is returned by [HealthEvents.Inject] for an XID or ECC
// event that no event set watched: it was injected, and nobody saw it.
var ErrNotWatched = errors.New("no health watcher registered for the GPU's events")

// HealthEvents injects health events into simulated GPUs. Pass it to
// [Node.Hardware] with [WithHealthEvents]; one HealthEvents may serve the
// hardware of several nodes. The zero value is ready; it is safe for
// concurrent use.
type HealthEvents struct {
	mu   sync.Mutex
	gpus map[gpuKey]*gpuHealth
	// nodes are the GPU counts of the nodes whose hardware uses it.
	nodes map[string]int
	sets  map[*fakeEventSet]bool
}

type gpuKey struct {
	node  string
	index int
}

type gpuHealth struct {
	lost   bool
	action nvml.DeviceGpuRecoveryAction
}

// WithHealthEvents lets h inject health events into the hardware's GPUs.
// Without it, the GPUs stay healthy.
func WithHealthEvents(h *HealthEvents) HardwareOption {
	return func(o *hardwareOptions) { o.health = h }
}

// Inject makes e happen to the GPU with NVML index gpu on the node. The
// node's hardware must have been made with [WithHealthEvents] (h). An XID
// or ECC event that no health watcher's event set registered for returns
// an error wrapping [ErrNotWatched]; the GPU's condition changed all the
// same.
func (h *HealthEvents) Inject(node string, gpu int, e HealthEvent) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	count, ok := h.nodes[node]
	switch {
	case !ok:
		return fmt.Errorf("inject %s: no simulated hardware of node %q takes health events", e, node)
	case gpu < 0 || gpu >= count:
		return fmt.Errorf("inject %s: node %q has GPUs 0 to %d, not %d", e, node, count-1, gpu)
	case e.MIG != nil && e.Kind != InjectXID && e.Kind != InjectECCDBE:
		return fmt.Errorf("inject %s: only XID and ECC events come from a MIG device", e)
	}
	g := h.gpu(gpuKey{node, gpu})
	data := nvml.EventData{GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
	if e.MIG != nil {
		data.GpuInstanceId, data.ComputeInstanceId = uint32(e.MIG.GI), uint32(e.MIG.CI)
	}
	switch e.Kind {
	case InjectXID, InjectECCDBE:
		if g.lost {
			return fmt.Errorf("inject %s: GPU %d of node %q is lost; it reports nothing until it recovers", e, gpu, node)
		}
		g.action = nvml.GPU_RECOVERY_ACTION_GPU_RESET
		data.EventType, data.EventData = nvml.EventTypeDoubleBitEccError, 0
		if e.Kind == InjectXID {
			data.EventType, data.EventData = nvml.EventTypeXidCriticalError, e.XID
		}
		if h.deliver(node, gpu, data, nvml.SUCCESS) == 0 {
			return fmt.Errorf("inject %s on GPU %d of node %q: %w", e, gpu, node, ErrNotWatched)
		}
	case InjectGPULost:
		g.lost = true
		h.deliver(node, gpu, nvml.EventData{}, nvml.ERROR_GPU_IS_LOST)
	case InjectRecover:
		g.lost, g.action = false, nvml.GPU_RECOVERY_ACTION_NONE
		data.EventType = nvml.EventTypeGpuRecoveryAction
		h.deliver(node, gpu, data, nvml.SUCCESS)
	default:
		return fmt.Errorf("inject %q: must be one of %s", e.Kind, strings.Join(InjectKinds, ", "))
	}
	return nil
}

// Watched reports whether a health watcher's event set registered for the
// XID events of the GPU with NVML index gpu on the node: from then on an
// injected XID is seen. Callers that inject right after starting a plugin
// wait for it.
func (h *HealthEvents) Watched(node string, gpu int) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.sets {
		if s.nv.node != node {
			continue
		}
		s.mu.Lock()
		ok := !s.freed && s.registered[gpu]&nvml.EventTypeXidCriticalError != 0
		s.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// gpu returns the condition of a GPU; the caller holds h.mu.
func (h *HealthEvents) gpu(k gpuKey) *gpuHealth {
	if h.gpus == nil {
		h.gpus = map[gpuKey]*gpuHealth{}
	}
	g := h.gpus[k]
	if g == nil {
		g = &gpuHealth{}
		h.gpus[k] = g
	}
	return g
}

// deliver queues an event (or, with an error, a failing wait) on every
// event set of the node that registered the GPU for the event's type, and
// returns how many did; the caller holds h.mu.
func (h *HealthEvents) deliver(node string, gpu int, data nvml.EventData, ret nvml.Return) int {
	n := 0
	for s := range h.sets {
		if s.nv.node != node {
			continue
		}
		if s.post(gpu, data, ret) {
			n++
		}
	}
	return n
}

// addNode records a node's hardware.
func (h *HealthEvents) addNode(node string, gpus int) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.nodes == nil {
		h.nodes = map[string]int{}
	}
	h.nodes[node] = gpus
}

// lost reports whether a GPU is lost. A nil h has no lost GPUs.
func (h *HealthEvents) lost(node string, gpu int) bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	g := h.gpus[gpuKey{node, gpu}]
	return g != nil && g.lost
}

// recoveryAction returns a GPU's recovery action.
func (h *HealthEvents) recoveryAction(node string, gpu int) nvml.DeviceGpuRecoveryAction {
	if h == nil {
		return nvml.GPU_RECOVERY_ACTION_NONE
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if g := h.gpus[gpuKey{node, gpu}]; g != nil {
		return g.action
	}
	return nvml.GPU_RECOVERY_ACTION_NONE
}

func (h *HealthEvents) addSet(s *fakeEventSet) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.sets == nil {
		h.sets = map[*fakeEventSet]bool{}
	}
	h.sets[s] = true
}

func (h *HealthEvents) removeSet(s *fakeEventSet) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.sets, s)
}

// supportedEvents are the events every simulated GPU reports.
const supportedEvents = uint64(nvml.EventTypeSingleBitEccError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeXidCriticalError | nvml.EventTypeGpuRecoveryAction)

// fakeEventSet implements nvml.EventSet.
type fakeEventSet struct {
	mock.EventSet
	nv   *fakeNVML
	wake chan struct{}

	mu sync.Mutex
	// registered are the event types each GPU (by index) registered.
	registered map[int]uint64
	queue      []queuedEvent
	freed      bool
	// interrupted: Interrupt was called; every Wait returns at once.
	interrupted bool
}

type queuedEvent struct {
	data nvml.EventData
	ret  nvml.Return
}

// post queues an event of GPU gpu if the set watches it; data's Device is
// filled in with the set's own handle. A failing wait (ret) is queued for
// any registered GPU.
func (s *fakeEventSet) post(gpu int, data nvml.EventData, ret nvml.Return) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	mask, ok := s.registered[gpu]
	if s.freed || !ok || (ret == nvml.SUCCESS && mask&data.EventType == 0) {
		return false
	}
	if ret == nvml.SUCCESS {
		data.Device = s.nv.devices[gpu]
	}
	s.queue = append(s.queue, queuedEvent{data: data, ret: ret})
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return true
}

// EventSetCreate implements nvml.Interface.
func (f *fakeNVML) EventSetCreate() (nvml.EventSet, nvml.Return) {
	if ret := f.faults.hit("nvmlEventSetCreate"); ret != nvml.SUCCESS {
		return nil, ret
	}
	s := &fakeEventSet{nv: f, wake: make(chan struct{}, 1), registered: map[int]uint64{}}
	f.health.addSet(s)
	return s, nvml.SUCCESS
}

// Wait implements nvml.EventSet: the next queued event, or
// NVML_ERROR_TIMEOUT after timeoutms.
func (s *fakeEventSet) Wait(timeoutms uint32) (nvml.EventData, nvml.Return) {
	if ret := s.nv.faults.hit("nvmlEventSetWait"); ret != nvml.SUCCESS {
		return nvml.EventData{}, ret
	}
	timer := time.NewTimer(time.Duration(timeoutms) * time.Millisecond)
	defer timer.Stop()
	for {
		s.mu.Lock()
		if s.freed {
			s.mu.Unlock()
			return nvml.EventData{}, nvml.ERROR_UNINITIALIZED
		}
		if s.interrupted {
			s.mu.Unlock()
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		}
		if len(s.queue) > 0 {
			e := s.queue[0]
			s.queue = slices.Delete(s.queue, 0, 1)
			s.mu.Unlock()
			return e.data, e.ret
		}
		s.mu.Unlock()
		select {
		case <-s.wake:
		case <-timer.C:
			return nvml.EventData{}, nvml.ERROR_TIMEOUT
		}
	}
}

// Interrupt implements [nvmlhw.InterruptibleEventSet].
func (s *fakeEventSet) Interrupt() {
	s.mu.Lock()
	s.interrupted = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Free implements nvml.EventSet.
func (s *fakeEventSet) Free() nvml.Return {
	if ret := s.nv.faults.hit("nvmlEventSetFree"); ret != nvml.SUCCESS {
		return ret
	}
	s.mu.Lock()
	s.freed = true
	s.mu.Unlock()
	s.nv.health.removeSet(s)
	return nvml.SUCCESS
}

// hit counts a call on the GPU in the Faults and fails it as they say,
// with NVML_ERROR_GPU_IS_LOST while the GPU is lost, or else with the
// error the fleet file says the GPU always answers it with. The call is
// counted first, so that armed faults count the calls a test sees; a lost
// GPU answers nothing, whatever its quirks.
func (d *fakeDevice) hit(call string) nvml.Return {
	if ret := d.nv.faults.hit(call); ret != nvml.SUCCESS {
		return ret
	}
	if d.nv.health.lost(d.nv.node, d.index) {
		return nvml.ERROR_GPU_IS_LOST
	}
	if ret, ok := d.unanswered[call]; ok {
		return ret
	}
	return nvml.SUCCESS
}

// GetSupportedEventTypes implements nvml.Device.
func (d *fakeDevice) GetSupportedEventTypes() (uint64, nvml.Return) {
	if ret := d.hit("nvmlDeviceGetSupportedEventTypes"); ret != nvml.SUCCESS {
		return 0, ret
	}
	return supportedEvents, nvml.SUCCESS
}

// RegisterEvents implements nvml.Device.
func (d *fakeDevice) RegisterEvents(types uint64, set nvml.EventSet) nvml.Return {
	if ret := d.hit("nvmlDeviceRegisterEvents"); ret != nvml.SUCCESS {
		return ret
	}
	s, ok := set.(*fakeEventSet)
	if !ok || s.nv != d.nv || types&^supportedEvents != 0 {
		return nvml.ERROR_INVALID_ARGUMENT
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.registered[d.index] |= types
	return nvml.SUCCESS
}

// GetFieldValues implements nvml.Device: the recovery action, and
// NVML_ERROR_NOT_SUPPORTED for every other field.
func (d *fakeDevice) GetFieldValues(values []nvml.FieldValue) nvml.Return {
	if ret := d.hit("nvmlDeviceGetFieldValues"); ret != nvml.SUCCESS {
		return ret
	}
	for i := range values {
		v := &values[i]
		if v.FieldId != nvml.FI_DEV_GET_GPU_RECOVERY_ACTION {
			v.NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
			continue
		}
		v.NvmlReturn = uint32(nvml.SUCCESS)
		v.ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
		a := uint32(d.nv.health.recoveryAction(d.nv.node, d.index))
		v.Value = [8]byte{byte(a), byte(a >> 8), byte(a >> 16), byte(a >> 24)}
	}
	return nvml.SUCCESS
}
