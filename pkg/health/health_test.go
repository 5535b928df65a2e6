package health

import (
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpudra/gpudra/pkg/hardware"
)

const driver = "gpu.nvidia.com"

func ev(kind hardware.HealthEventKind, xid uint64) hardware.HealthEvent {
	return hardware.HealthEvent{GPUUUID: "GPU-a", Kind: kind, XID: xid, GIID: hardware.NoInstance, CIID: hardware.NoInstance, Time: time.Unix(100, 0)}
}

// The policy table of docs/guides/health.md: each sequence of events ends in the
// taints the row gives.
func TestPolicyTable(t *testing.T) {
	noSched, noExec := resourceapi.DeviceTaintEffectNoSchedule, resourceapi.DeviceTaintEffectNoExecute
	mig := ev(hardware.HealthXID, 94)
	mig.GIID, mig.CIID = 1, 0
	for _, tc := range []struct {
		name    string
		policy  Policy
		events  []hardware.HealthEvent
		want    []resourceapi.DeviceTaint
		changed []bool // per event
	}{
		{"application XIDs change nothing", DefaultPolicy(),
			[]hardware.HealthEvent{ev(hardware.HealthXID, 13), ev(hardware.HealthXID, 31), ev(hardware.HealthXID, 43), ev(hardware.HealthXID, 45), ev(hardware.HealthXID, 68), ev(hardware.HealthXID, 109)},
			nil, []bool{false, false, false, false, false, false}},
		{"a fatal XID taints NoSchedule with its number", DefaultPolicy(),
			[]hardware.HealthEvent{ev(hardware.HealthXID, 79)},
			[]resourceapi.DeviceTaint{{Key: "gpu.nvidia.com/xid", Value: "79", Effect: noSched}}, []bool{true}},
		{"the same XID again changes nothing; another replaces it", DefaultPolicy(),
			[]hardware.HealthEvent{ev(hardware.HealthXID, 79), ev(hardware.HealthXID, 79), ev(hardware.HealthXID, 48)},
			[]resourceapi.DeviceTaint{{Key: "gpu.nvidia.com/xid", Value: "48", Effect: noSched}}, []bool{true, false, true}},
		{"double-bit ECC taints NoSchedule", DefaultPolicy(),
			[]hardware.HealthEvent{ev(hardware.HealthECCDoubleBit, 0)},
			[]resourceapi.DeviceTaint{{Key: "gpu.nvidia.com/ecc-dbe", Effect: noSched}}, []bool{true}},
		{"a lost GPU taints NoExecute", DefaultPolicy(),
			[]hardware.HealthEvent{ev(hardware.HealthXID, 79), ev(hardware.HealthGPULost, 0)},
			[]resourceapi.DeviceTaint{{Key: "gpu.nvidia.com/gpu-lost", Effect: noExec}, {Key: "gpu.nvidia.com/xid", Value: "79", Effect: noSched}}, []bool{true, true}},
		{"recovery clears everything", DefaultPolicy(),
			[]hardware.HealthEvent{ev(hardware.HealthXID, 79), ev(hardware.HealthECCDoubleBit, 0), ev(hardware.HealthGPULost, 0), ev(hardware.HealthRecovered, 0)},
			nil, []bool{true, true, true, true}},
		{"recovery of a healthy GPU changes nothing", DefaultPolicy(),
			[]hardware.HealthEvent{ev(hardware.HealthRecovered, 0)}, nil, []bool{false}},
		{"a MIG device's XID taints the GPU", DefaultPolicy(),
			[]hardware.HealthEvent{mig},
			[]resourceapi.DeviceTaint{{Key: "gpu.nvidia.com/xid", Value: "94", Effect: noSched}}, []bool{true}},
		{"flags: ignore 79, lost NoSchedule", Policy{IgnoreXIDs: []uint64{79}, FaultEffect: noSched, LostEffect: noSched},
			[]hardware.HealthEvent{ev(hardware.HealthXID, 79), ev(hardware.HealthXID, 13), ev(hardware.HealthGPULost, 0)},
			[]resourceapi.DeviceTaint{{Key: "gpu.nvidia.com/gpu-lost", Effect: noSched}, {Key: "gpu.nvidia.com/xid", Value: "13", Effect: noSched}}, []bool{false, true, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s *State
			for i, e := range tc.events {
				var tr Transition
				s, tr = s.Apply(tc.policy, e)
				if tr.Changed() != tc.changed[i] {
					t.Errorf("event %d (%s): changed %v, want %v", i, e, tr.Changed(), tc.changed[i])
				}
			}
			got := s.Condition("GPU-a").Taints(driver, tc.policy)
			if len(got) != len(tc.want) {
				t.Fatalf("taints %+v, want %+v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("taint %d: %+v, want %+v", i, got[i], tc.want[i])
				}
			}
			if healthy := len(tc.want) == 0; healthy != (len(s.Unhealthy()) == 0) {
				t.Errorf("unhealthy GPUs %v with taints %v", s.Unhealthy(), tc.want)
			}
		})
	}
}

// States are values: applying an event leaves the state it was applied to
// as it was.
func TestStateIsNeverModified(t *testing.T) {
	s1, _ := (*State)(nil).Apply(DefaultPolicy(), ev(hardware.HealthXID, 79))
	s2, _ := s1.Apply(DefaultPolicy(), ev(hardware.HealthRecovered, 0))
	if s1.Condition("GPU-a").XID != 79 || !s2.Condition("GPU-a").Healthy() {
		t.Errorf("s1 %v, s2 %v", s1.Condition("GPU-a"), s2.Condition("GPU-a"))
	}
	if c := s1.Condition("GPU-a"); !c.Since.Equal(time.Unix(100, 0)) || !strings.Contains(c.String(), "xid 79") {
		t.Errorf("condition %+v", c)
	}
}

func TestParseFlags(t *testing.T) {
	if got, err := ParseXIDs("health-ignore-xids", " 13, 31,13,,48 "); err != nil || FormatXIDs(got) != "13,31,48" {
		t.Errorf("got %v, %v", got, err)
	}
	if got, err := ParseXIDs("health-ignore-xids", ""); err != nil || len(got) != 0 {
		t.Errorf("empty: got %v, %v", got, err)
	}
	for _, bad := range []string{"13,x", "-1", "0"} {
		if _, err := ParseXIDs("health-ignore-xids", bad); err == nil || !strings.Contains(err.Error(), "--health-ignore-xids") {
			t.Errorf("%q: got %v, want an error naming the flag", bad, err)
		}
	}
	if e, err := ParseEffect("health-lost-effect", "NoSchedule"); err != nil || e != resourceapi.DeviceTaintEffectNoSchedule {
		t.Errorf("got %v, %v", e, err)
	}
	if _, err := ParseEffect("health-lost-effect", "PreferNoSchedule"); err == nil || !strings.Contains(err.Error(), "--health-lost-effect") || !strings.Contains(err.Error(), "None, NoSchedule, NoExecute") {
		t.Errorf("got %v, want an error naming the flag and the allowed values", err)
	}
}

// flap100 drives a debouncer with a GPU flapping 100 times in 10 s (a
// change every 100 ms) on a fake clock, and returns the flushes.
func flap100(t testing.TB) int {
	c := clocktesting.NewFakeClock(time.Unix(0, 0))
	d := NewDebouncer(c, DefaultSettle, DefaultInterval, func() {})
	for i := 0; i < 100; i++ {
		d.Changed()
		c.Step(100 * time.Millisecond)
	}
	c.Step(2 * DefaultInterval)
	return d.Flushes()
}

// TestFlappingGPUIsDebounced: 100 changes in 10 s make at most one flush
// per interval, and the last change is flushed too.
func TestFlappingGPUIsDebounced(t *testing.T) {
	got := flap100(t)
	if got > 11 || got < 10 {
		t.Errorf("%d flushes for 100 changes in 10 s, want 10 or 11 (one per second)", got)
	}
	t.Logf("100 changes in 10 s: %d flushes", got)
}

func BenchmarkFlap100(b *testing.B) {
	var n int
	for b.Loop() {
		n = flap100(b)
	}
	b.ReportMetric(float64(n), "flushes/100flaps")
}

func TestDebouncerTiming(t *testing.T) {
	c := clocktesting.NewFakeClock(time.Unix(0, 0))
	flushed := 0
	d := NewDebouncer(c, DefaultSettle, DefaultInterval, func() { flushed++ })
	d.Changed()
	c.Step(DefaultSettle - time.Millisecond)
	if flushed != 0 {
		t.Fatal("flushed before settling")
	}
	c.Step(time.Millisecond)
	if flushed != 1 {
		t.Fatalf("not flushed %v after the first change", DefaultSettle)
	}
	// A change right after waits for the interval.
	d.Changed()
	d.Changed()
	c.Step(DefaultInterval - time.Millisecond)
	if flushed != 1 {
		t.Fatal("flushed again within the interval")
	}
	c.Step(time.Millisecond)
	if flushed != 2 {
		t.Fatal("second change not flushed one interval after the first flush")
	}
	d.Changed()
	d.Stop()
	c.Step(time.Minute)
	if flushed != 2 {
		t.Error("flushed after Stop")
	}
}

// TestZeroStateApplies: a State{} (not nil) takes events like a nil one.
func TestZeroStateApplies(t *testing.T) {
	next, tr := (&State{}).Apply(DefaultPolicy(), hardware.HealthEvent{GPUUUID: "GPU-a", Kind: hardware.HealthGPULost})
	if !tr.Changed() || !next.Condition("GPU-a").Lost {
		t.Errorf("got %+v, %+v", next, tr)
	}
}
