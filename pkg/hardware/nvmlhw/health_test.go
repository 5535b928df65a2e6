package nvmlhw

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/hardware"
)

func TestHealthEventFrom(t *testing.T) {
	at := time.Unix(100, 0)
	for _, tc := range []struct {
		name string
		data nvml.EventData
		want hardware.HealthEvent
		ok   bool
	}{
		{"xid of the whole GPU", nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: 79, GpuInstanceId: noInstance, ComputeInstanceId: noInstance},
			hardware.HealthEvent{GPUUUID: "GPU-a", Kind: hardware.HealthXID, XID: 79, GIID: hardware.NoInstance, CIID: hardware.NoInstance, Time: at}, true},
		{"xid of a MIG device", nvml.EventData{EventType: nvml.EventTypeXidCriticalError, EventData: 31, GpuInstanceId: 1, ComputeInstanceId: 0},
			hardware.HealthEvent{GPUUUID: "GPU-a", Kind: hardware.HealthXID, XID: 31, GIID: 1, CIID: 0, Time: at}, true},
		{"double-bit ECC", nvml.EventData{EventType: nvml.EventTypeDoubleBitEccError, GpuInstanceId: noInstance, ComputeInstanceId: noInstance},
			hardware.HealthEvent{GPUUUID: "GPU-a", Kind: hardware.HealthECCDoubleBit, GIID: hardware.NoInstance, CIID: hardware.NoInstance, Time: at}, true},
		{"recovery action changed", nvml.EventData{EventType: nvml.EventTypeGpuRecoveryAction}, hardware.HealthEvent{}, false},
		{"single-bit ECC is no health event", nvml.EventData{EventType: nvml.EventTypeSingleBitEccError}, hardware.HealthEvent{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := healthEventFrom(tc.data, "GPU-a", at)
			if ok != tc.ok || got != tc.want {
				t.Errorf("got %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// fieldDevice answers the recovery-action field as its fields say.
type fieldDevice struct {
	mock.Device
	call   nvml.Return // the call's answer
	field  nvml.Return // the field's answer
	action nvml.DeviceGpuRecoveryAction
}

func (d *fieldDevice) GetFieldValues(values []nvml.FieldValue) nvml.Return {
	if d.call != nvml.SUCCESS {
		return d.call
	}
	values[0].NvmlReturn = uint32(d.field)
	values[0].ValueType = uint32(nvml.VALUE_TYPE_UNSIGNED_INT)
	binary.LittleEndian.PutUint32(values[0].Value[:4], uint32(d.action))
	return nvml.SUCCESS
}

// TestHealthCheck walks one GPU through the poll's states: each step sets
// what the GPU answers, moves the clock and says which event the poll
// gives.
func TestHealthCheck(t *testing.T) {
	type step struct {
		call, field nvml.Return
		action      nvml.DeviceGpuRecoveryAction
		fault       bool // an XID event comes before the poll
		after       time.Duration
		want        hardware.HealthEventKind // "" for none
	}
	ok := nvml.SUCCESS
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"reset asked for, then done", []step{
			{fault: true, call: ok, field: ok, action: nvml.GPU_RECOVERY_ACTION_GPU_RESET},
			{call: ok, field: ok, action: nvml.GPU_RECOVERY_ACTION_GPU_RESET, after: time.Minute},
			{call: ok, field: ok, action: nvml.GPU_RECOVERY_ACTION_NONE, after: time.Second, want: hardware.HealthRecovered},
			{call: ok, field: ok, action: nvml.GPU_RECOVERY_ACTION_NONE, after: time.Minute},
		}},
		{"nothing asked for: recovered one poll interval after the fault", []step{
			{fault: true, call: ok, field: ok},
			{call: ok, field: ok, after: time.Second},
			{call: ok, field: ok, after: 5 * time.Second, want: hardware.HealthRecovered},
		}},
		{"no recovery-action field: the fault stays", []step{
			{fault: true, call: ok, field: nvml.ERROR_NOT_SUPPORTED},
			{call: ok, field: nvml.ERROR_NOT_SUPPORTED, after: time.Hour},
		}},
		{"lost, then back", []step{
			{call: nvml.ERROR_GPU_IS_LOST, want: hardware.HealthGPULost},
			{call: nvml.ERROR_GPU_IS_LOST, after: time.Minute},
			{call: ok, field: nvml.ERROR_NOT_SUPPORTED, after: time.Minute, want: hardware.HealthRecovered},
		}},
		{"lost in the field's answer", []step{
			{call: ok, field: nvml.ERROR_GPU_IS_LOST, want: hardware.HealthGPULost},
		}},
		{"a healthy GPU gives nothing", []step{
			{call: ok, field: ok},
			{call: ok, field: ok, action: nvml.GPU_RECOVERY_ACTION_NODE_REBOOT, after: time.Minute},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1000, 0)
			dev := &fieldDevice{}
			w := &healthWatch{poll: 5 * time.Second, now: func() time.Time { return now }, gpus: map[string]*watchedGPU{}, logger: klog.Background()}
			g := &watchedGPU{uuid: "GPU-a", dev: dev}
			for i, s := range tc.steps {
				now = now.Add(s.after)
				dev.call, dev.field, dev.action = s.call, s.field, s.action
				if s.fault {
					w.gpus["GPU-a"] = g
					events, from := w.fromEvent(nvml.EventData{Device: dev, EventType: nvml.EventTypeXidCriticalError, EventData: 48, GpuInstanceId: noInstance, ComputeInstanceId: noInstance})
					if from != g || len(events) != 1 || events[0].Kind != hardware.HealthXID {
						t.Fatalf("step %d: fault event: got %+v from %v", i, events, from)
					}
				}
				got := w.check(g)
				switch {
				case s.want == "" && len(got) > 0:
					t.Errorf("step %d: got %+v, want no event", i, got)
				case s.want != "" && (len(got) != 1 || got[0].Kind != s.want || got[0].GPUUUID != "GPU-a"):
					t.Errorf("step %d: got %+v, want one %s event", i, got, s.want)
				}
			}
		})
	}
}

func TestFieldUint(t *testing.T) {
	var v nvml.FieldValue
	binary.LittleEndian.PutUint64(v.Value[:], 0xdead_0000_0004)
	for typ, want := range map[nvml.ValueType]uint64{
		nvml.VALUE_TYPE_UNSIGNED_INT:       4,
		nvml.VALUE_TYPE_UNSIGNED_SHORT:     4,
		nvml.VALUE_TYPE_UNSIGNED_LONG_LONG: 0xdead_0000_0004,
	} {
		v.ValueType = uint32(typ)
		if got := fieldUint(v); got != want {
			t.Errorf("type %d: got %#x, want %#x", typ, got, want)
		}
	}
}

// TestConditionOf maps NVML's answers for one GPU to its condition.
func TestConditionOf(t *testing.T) {
	for _, tc := range []struct {
		name      string
		handle    nvml.Return
		uuid      nvml.Return
		call      nvml.Return
		field     nvml.Return
		action    nvml.DeviceGpuRecoveryAction
		want      string
		wantErr   string
		wantRecov hardware.RecoveryAction
	}{
		{name: "healthy", action: nvml.GPU_RECOVERY_ACTION_NONE, want: "ok", wantRecov: hardware.RecoveryNone},
		{name: "needs a reset", action: nvml.GPU_RECOVERY_ACTION_GPU_RESET, want: "needs gpu-reset", wantRecov: hardware.RecoveryGPUReset},
		{name: "needs a reboot", action: nvml.GPU_RECOVERY_ACTION_NODE_REBOOT, want: "needs node-reboot", wantRecov: hardware.RecoveryNodeReboot},
		{name: "driver without the field", field: nvml.ERROR_NOT_SUPPORTED, want: "ok", wantRecov: hardware.RecoveryUnreported},
		{name: "lost at the field", call: nvml.ERROR_GPU_IS_LOST, want: "lost"},
		{name: "lost at the UUID", uuid: nvml.ERROR_GPU_IS_LOST, want: "lost"},
		{name: "lost at the handle", handle: nvml.ERROR_GPU_IS_LOST, want: "lost"},
		{name: "other error", call: nvml.ERROR_UNKNOWN, want: "unknown", wantErr: "GPU 0: nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION): " + nvml.ERROR_UNKNOWN.Error()},
		{name: "no permission for the handle", handle: nvml.ERROR_NO_PERMISSION, want: "unknown", wantErr: "GPU 0: nvmlDeviceGetHandleByIndex: " + nvml.ERROR_NO_PERMISSION.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev := &fieldDevice{call: tc.call, field: tc.field, action: tc.action}
			dev.GetUUIDFunc = func() (string, nvml.Return) { return "GPU-a", tc.uuid }
			lib := &mock.Interface{DeviceGetHandleByIndexFunc: func(int) (nvml.Device, nvml.Return) { return dev, tc.handle }}
			c := conditionOf(lib, 0)
			if c.String() != tc.want || c.Err != tc.wantErr || c.Recovery != tc.wantRecov {
				t.Errorf("got %+v (%s, err %q), want %s, err %q, recovery %q", c, c, c.Err, tc.want, tc.wantErr, tc.wantRecov)
			}
			if c.Healthy() != (tc.want == "ok") {
				t.Errorf("Healthy() = %v for %s", c.Healthy(), c)
			}
			if wantUUID := tc.handle == nvml.SUCCESS && tc.uuid == nvml.SUCCESS; (c.UUID == "GPU-a") != wantUUID {
				t.Errorf("UUID %q", c.UUID)
			}
		})
	}
}

// TestEventDrivenPollDue: over an event set that reports every change, a
// poll is due only for what time alone tells.
func TestEventDrivenPollDue(t *testing.T) {
	last := time.Unix(1000, 0)
	fault := last.Add(2 * time.Second)
	for _, tc := range []struct {
		name       string
		incomplete bool
		gpu        watchedGPU
		want       time.Time
	}{
		{name: "an idle GPU that raises events", gpu: watchedGPU{registered: true}},
		{name: "a GPU whose recovery action was read", gpu: watchedGPU{registered: true, faulted: true, lastFault: fault, sawAction: true}},
		{name: "a lost GPU", gpu: watchedGPU{registered: true, faulted: true, lastFault: fault, lost: true}},
		{name: "a fault whose recovery time tells", gpu: watchedGPU{registered: true, faulted: true, lastFault: fault}, want: fault.Add(5 * time.Second)},
		{name: "a GPU that raises no recovery events", gpu: watchedGPU{registered: true, polledOnly: true}, want: last.Add(5 * time.Second)},
		{name: "an enumeration that failed", incomplete: true, gpu: watchedGPU{registered: true}, want: last.Add(5 * time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := tc.gpu
			w := &healthWatch{poll: 5 * time.Second, lastPoll: last, incomplete: tc.incomplete, gpus: map[string]*watchedGPU{"GPU-a": &g}}
			if got := w.due(); !got.Equal(tc.want) {
				t.Errorf("due %v, want %v", got, tc.want)
			}
		})
	}
}
