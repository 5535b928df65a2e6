package claimstate_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/claimstate"
)

const pool = "node-a"

var t0 = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// dev is an exclusively allocated device of request "gpu".
func dev(name string) claimstate.Device {
	return claimstate.Device{Requests: []string{"gpu"}, Pool: pool, Name: name}
}

func share(name, id string) claimstate.Device {
	d := dev(name)
	d.ShareID = id
	return d
}

func admin(name string) claimstate.Device {
	d := dev(name)
	d.AdminAccess = true
	return d
}

func inPool(p, name string) claimstate.Device {
	d := dev(name)
	d.Pool = p
	return d
}

// prepared is d as it looks after preparation: with its CDI device ID.
func prepared(uid string, d claimstate.Device) claimstate.Device {
	d.CDIDeviceIDs = []string{"k8s.gpu.nvidia.com/claim=" + uid + "-" + d.Name}
	return d
}

func intent(uid string, devices ...claimstate.Device) claimstate.Intent {
	return claimstate.Intent{
		UID: uid, Namespace: "ns", Name: "claim-" + uid,
		Consumers: []claimstate.Consumer{{Name: "pod-" + uid, UID: "pod-uid-" + uid}},
		Devices:   devices,
	}
}

func claim(uid string, phase claimstate.Phase, devices ...claimstate.Device) *claimstate.Claim {
	return &claimstate.Claim{
		UID: uid, Namespace: "ns", Name: "claim-" + uid, Phase: phase, StartedAt: t0,
		Consumers: []claimstate.Consumer{{Name: "pod-" + uid, UID: "pod-uid-" + uid}},
		Devices:   devices,
	}
}

func stateOf(claims ...*claimstate.Claim) *claimstate.State {
	s := claimstate.New()
	for _, c := range claims {
		s.Claims[c.UID] = c
	}
	return s
}

// wantConflict checks that err is a *ConflictError over device held by
// holderUID, with a message naming both.
func wantConflict(t *testing.T, err error, device, holderUID string) {
	t.Helper()
	var conflict *claimstate.ConflictError
	if !errors.As(err, &conflict) {
		t.Fatalf("error %v (%T), want a *ConflictError", err, err)
	}
	if conflict.Device != device || conflict.Holder == nil || conflict.Holder.UID != holderUID {
		t.Fatalf("conflict over %q held by %+v, want %q held by %s", conflict.Device, conflict.Holder, device, holderUID)
	}
	for _, part := range []string{device, "ns/claim-" + holderUID, holderUID} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("message %q does not name %q", err, part)
		}
	}
}

func TestPlanPrepare(t *testing.T) {
	tests := []struct {
		name       string
		state      *claimstate.State
		intent     claimstate.Intent
		want       claimstate.PrepareAction
		wantRecord string // UID of the returned record, "" for nil
		// conflict is "device holder" for a *ConflictError.
		conflict []string
		wantErr  string
	}{
		{
			name:   "new claim",
			state:  stateOf(),
			intent: intent("a", dev("gpu-0")),
			want:   claimstate.ActionPrepare,
		},
		{
			name:       "completed with the same devices: return the record",
			state:      stateOf(claim("a", claimstate.PrepareCompleted, prepared("a", dev("gpu-0")), prepared("a", dev("gpu-1")))),
			intent:     intent("a", dev("gpu-0"), dev("gpu-1")),
			want:       claimstate.ActionReturnRecorded,
			wantRecord: "a",
		},
		{
			name:       "completed with different devices",
			state:      stateOf(claim("a", claimstate.PrepareCompleted, prepared("a", dev("gpu-0")))),
			intent:     intent("a", dev("gpu-1")),
			wantRecord: "a",
			wantErr:    "already prepared with devices [node-a/gpu-0], not [node-a/gpu-1]",
		},
		{
			name:       "completed with the devices in another order",
			state:      stateOf(claim("a", claimstate.PrepareCompleted, dev("gpu-0"), dev("gpu-1"))),
			intent:     intent("a", dev("gpu-1"), dev("gpu-0")),
			wantRecord: "a",
			wantErr:    "already prepared",
		},
		{
			name:       "completed as a share, asked for exclusively",
			state:      stateOf(claim("a", claimstate.PrepareCompleted, share("gpu-0", "s1"))),
			intent:     intent("a", dev("gpu-0")),
			wantRecord: "a",
			wantErr:    "already prepared with devices [node-a/gpu-0@s1]",
		},
		{
			name:       "completed with admin access, asked for without",
			state:      stateOf(claim("a", claimstate.PrepareCompleted, admin("gpu-0"))),
			intent:     intent("a", dev("gpu-0")),
			wantRecord: "a",
			wantErr:    "[node-a/gpu-0(admin)]",
		},
		{
			name:       "started: roll back, then prepare",
			state:      stateOf(claim("a", claimstate.PrepareStarted, dev("gpu-0"))),
			intent:     intent("a", dev("gpu-0")),
			want:       claimstate.ActionRollbackThenPrepare,
			wantRecord: "a",
		},
		{
			name:       "started with other devices: roll back, then prepare",
			state:      stateOf(claim("a", claimstate.PrepareStarted, dev("gpu-3"))),
			intent:     intent("a", dev("gpu-0")),
			want:       claimstate.ActionRollbackThenPrepare,
			wantRecord: "a",
		},
		{
			name:       "started, but the device went to another claim meanwhile",
			state:      stateOf(claim("a", claimstate.PrepareStarted, dev("gpu-0")), claim("b", claimstate.PrepareCompleted, dev("gpu-0"))),
			intent:     intent("a", dev("gpu-0")),
			wantRecord: "a",
			conflict:   []string{"node-a/gpu-0", "b"},
		},
		{
			name:     "exclusive vs exclusive of a completed claim",
			state:    stateOf(claim("b", claimstate.PrepareCompleted, dev("gpu-1"), dev("gpu-0"))),
			intent:   intent("a", dev("gpu-0")),
			conflict: []string{"node-a/gpu-0", "b"},
		},
		{
			name:     "exclusive vs exclusive of a started claim",
			state:    stateOf(claim("b", claimstate.PrepareStarted, dev("gpu-0"))),
			intent:   intent("a", dev("gpu-2"), dev("gpu-0")),
			conflict: []string{"node-a/gpu-0", "b"},
		},
		{
			name:   "admin access wanted: never conflicts",
			state:  stateOf(claim("b", claimstate.PrepareCompleted, dev("gpu-0"))),
			intent: intent("a", admin("gpu-0")),
			want:   claimstate.ActionPrepare,
		},
		{
			name:   "admin access held: never conflicts",
			state:  stateOf(claim("b", claimstate.PrepareCompleted, admin("gpu-0"))),
			intent: intent("a", dev("gpu-0")),
			want:   claimstate.ActionPrepare,
		},
		{
			name:   "two shares",
			state:  stateOf(claim("b", claimstate.PrepareCompleted, share("gpu-0", "s1"))),
			intent: intent("a", share("gpu-0", "s2")),
			want:   claimstate.ActionPrepare,
		},
		{
			name:     "share wanted, held exclusively",
			state:    stateOf(claim("b", claimstate.PrepareCompleted, dev("gpu-0"))),
			intent:   intent("a", share("gpu-0", "s2")),
			conflict: []string{"node-a/gpu-0", "b"},
		},
		{
			name:     "exclusive wanted, held as a share",
			state:    stateOf(claim("b", claimstate.PrepareCompleted, share("gpu-0", "s1"))),
			intent:   intent("a", dev("gpu-0")),
			conflict: []string{"node-a/gpu-0", "b"},
		},
		{
			name:   "same name in another pool",
			state:  stateOf(claim("b", claimstate.PrepareCompleted, inPool("node-b", "gpu-0"))),
			intent: intent("a", dev("gpu-0")),
			want:   claimstate.ActionPrepare,
		},
		{
			name: "holder is the lowest UID of several",
			state: stateOf(
				claim("c", claimstate.PrepareCompleted, share("gpu-0", "s3")),
				claim("b", claimstate.PrepareCompleted, share("gpu-0", "s2")),
				claim("d", claimstate.PrepareCompleted, share("gpu-0", "s4")),
			),
			intent:   intent("a", dev("gpu-0")),
			conflict: []string{"node-a/gpu-0", "b"},
		},
		{
			name:   "no devices",
			state:  stateOf(claim("b", claimstate.PrepareCompleted, dev("gpu-0"))),
			intent: intent("a"),
			want:   claimstate.ActionPrepare,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.state.Clone()
			// Map order is random; a deterministic result must not depend on it.
			for range 20 {
				action, record, err := tt.state.PlanPrepare(tt.intent)
				switch {
				case tt.conflict != nil:
					wantConflict(t, err, tt.conflict[0], tt.conflict[1])
				case tt.wantErr != "":
					if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
						t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
					}
					var conflict *claimstate.ConflictError
					if errors.As(err, &conflict) {
						t.Errorf("error %v is a ConflictError", err)
					}
				default:
					if err != nil {
						t.Fatalf("PlanPrepare: %v", err)
					}
					if action != tt.want {
						t.Errorf("action %v, want %v", action, tt.want)
					}
				}
				gotRecord := ""
				if record != nil {
					gotRecord = record.UID
				}
				if gotRecord != tt.wantRecord {
					t.Errorf("record %q, want %q", gotRecord, tt.wantRecord)
				}
			}
			if !reflect.DeepEqual(tt.state, before) {
				t.Error("PlanPrepare changed the state")
			}
		})
	}
}

func TestRecordStarted(t *testing.T) {
	later := t0.Add(time.Minute)
	tests := []struct {
		name     string
		state    *claimstate.State
		intent   claimstate.Intent
		conflict []string
	}{
		{"new claim", stateOf(), intent("a", dev("gpu-0")), nil},
		{"restart of a started claim", stateOf(claim("a", claimstate.PrepareStarted, dev("gpu-0"))), intent("a", dev("gpu-0"), dev("gpu-1")), nil},
		{"own earlier record does not conflict", stateOf(claim("a", claimstate.PrepareStarted, dev("gpu-0"))), intent("a", dev("gpu-0")), nil},
		{"exclusive vs exclusive", stateOf(claim("b", claimstate.PrepareCompleted, dev("gpu-0"))), intent("a", dev("gpu-0")), []string{"node-a/gpu-0", "b"}},
		{"share vs exclusive", stateOf(claim("b", claimstate.PrepareStarted, dev("gpu-0"))), intent("a", share("gpu-0", "s1")), []string{"node-a/gpu-0", "b"}},
		{"two shares", stateOf(claim("b", claimstate.PrepareCompleted, share("gpu-0", "s1"))), intent("a", share("gpu-0", "s2")), nil},
		{"admin access", stateOf(claim("b", claimstate.PrepareCompleted, dev("gpu-0"))), intent("a", admin("gpu-0")), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.state.Clone()
			err := tt.state.RecordStarted(tt.intent, later)
			if tt.conflict != nil {
				wantConflict(t, err, tt.conflict[0], tt.conflict[1])
				if !reflect.DeepEqual(tt.state, before) {
					t.Error("a refused RecordStarted changed the state")
				}
				return
			}
			if err != nil {
				t.Fatalf("RecordStarted: %v", err)
			}
			want := &claimstate.Claim{
				UID: tt.intent.UID, Namespace: "ns", Name: "claim-" + tt.intent.UID,
				Phase: claimstate.PrepareStarted, StartedAt: later,
				Consumers: tt.intent.Consumers, Devices: tt.intent.Devices,
			}
			if got := tt.state.Claims[tt.intent.UID]; !reflect.DeepEqual(got, want) {
				t.Errorf("record\n got %+v\nwant %+v", got, want)
			}
			// The record is the state's own: changing the intent later
			// does not reach it.
			tt.intent.Devices[0].Name = "changed"
			tt.intent.Consumers[0].Name = "changed"
			if got := tt.state.Claims[tt.intent.UID]; got.Devices[0].Name == "changed" || got.Consumers[0].Name == "changed" {
				t.Error("the record shares memory with the intent")
			}
			// Nothing else changed.
			delete(tt.state.Claims, tt.intent.UID)
			delete(before.Claims, tt.intent.UID)
			if !reflect.DeepEqual(tt.state, before) {
				t.Error("RecordStarted changed other claims")
			}
		})
	}
}

func TestRecordCompleted(t *testing.T) {
	started := t0.Add(-time.Minute)
	gpu0 := prepared("a", dev("gpu-0"))
	tests := []struct {
		name      string
		state     *claimstate.State
		intent    claimstate.Intent
		startedAt time.Time
		// want is the record afterwards; nil when the call must fail.
		want     *claimstate.Claim
		conflict []string
		wantErr  string
	}{
		{
			name:      "after RecordStarted",
			state:     stateOf(claim("a", claimstate.PrepareStarted, dev("gpu-0"))),
			intent:    intent("a", gpu0),
			startedAt: started,
			want: &claimstate.Claim{UID: "a", Namespace: "ns", Name: "claim-a", Phase: claimstate.PrepareCompleted, StartedAt: started,
				Consumers: []claimstate.Consumer{{Name: "pod-a", UID: "pod-uid-a"}}, Devices: []claimstate.Device{gpu0}},
		},
		{
			name:      "without a start record",
			state:     stateOf(),
			intent:    intent("a", gpu0),
			startedAt: started,
			want: &claimstate.Claim{UID: "a", Namespace: "ns", Name: "claim-a", Phase: claimstate.PrepareCompleted, StartedAt: started,
				Consumers: []claimstate.Consumer{{Name: "pod-a", UID: "pod-uid-a"}}, Devices: []claimstate.Device{gpu0}},
		},
		{
			name:      "again with the same devices: idempotent, first record kept",
			state:     stateOf(claim("a", claimstate.PrepareCompleted, gpu0)),
			intent:    intent("a", dev("gpu-0")),
			startedAt: started,
			want:      claim("a", claimstate.PrepareCompleted, gpu0),
		},
		{
			name:      "again with other devices",
			state:     stateOf(claim("a", claimstate.PrepareCompleted, gpu0)),
			intent:    intent("a", dev("gpu-1")),
			startedAt: started,
			wantErr:   "completed concurrently with other devices",
		},
		{
			name:      "device taken by another claim meanwhile",
			state:     stateOf(claim("a", claimstate.PrepareStarted, dev("gpu-0")), claim("b", claimstate.PrepareCompleted, dev("gpu-0"))),
			intent:    intent("a", gpu0),
			startedAt: started,
			conflict:  []string{"node-a/gpu-0", "b"},
		},
		{
			name:      "share beside a share",
			state:     stateOf(claim("b", claimstate.PrepareCompleted, share("gpu-0", "s1"))),
			intent:    intent("a", share("gpu-0", "s2")),
			startedAt: started,
			want: &claimstate.Claim{UID: "a", Namespace: "ns", Name: "claim-a", Phase: claimstate.PrepareCompleted, StartedAt: started,
				Consumers: []claimstate.Consumer{{Name: "pod-a", UID: "pod-uid-a"}}, Devices: []claimstate.Device{share("gpu-0", "s2")}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.state.Clone()
			err := tt.state.RecordCompleted(tt.intent, tt.startedAt)
			switch {
			case tt.conflict != nil:
				wantConflict(t, err, tt.conflict[0], tt.conflict[1])
			case tt.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
			default:
				if err != nil {
					t.Fatalf("RecordCompleted: %v", err)
				}
				if got := tt.state.Claims[tt.intent.UID]; !reflect.DeepEqual(got, tt.want) {
					t.Errorf("record\n got %+v\nwant %+v", got, tt.want)
				}
				// Idempotent: a second call changes nothing.
				after := tt.state.Clone()
				if err := tt.state.RecordCompleted(tt.intent, tt.startedAt.Add(time.Hour)); err != nil {
					t.Errorf("second RecordCompleted: %v", err)
				}
				if !reflect.DeepEqual(tt.state, after) {
					t.Error("second RecordCompleted changed the state")
				}
				return
			}
			if !reflect.DeepEqual(tt.state, before) {
				t.Error("a refused RecordCompleted changed the state")
			}
		})
	}
}

// TestLifecycle walks one claim through the machine as the plugin drives
// it, with a second claim competing for its device.
func TestLifecycle(t *testing.T) {
	s := claimstate.New()
	a := intent("a", dev("gpu-0"))

	mustAction := func(in claimstate.Intent, want claimstate.PrepareAction) {
		t.Helper()
		got, _, err := s.PlanPrepare(in)
		if err != nil || got != want {
			t.Fatalf("PlanPrepare(%s) = %v, %v; want %v", in.UID, got, err, want)
		}
	}
	mustAction(a, claimstate.ActionPrepare)
	if err := s.RecordStarted(a, t0); err != nil {
		t.Fatal(err)
	}
	// Crash here: the next Prepare rolls back first.
	mustAction(a, claimstate.ActionRollbackThenPrepare)
	// Meanwhile nobody else gets the device.
	_, _, err := s.PlanPrepare(intent("b", dev("gpu-0")))
	wantConflict(t, err, "node-a/gpu-0", "a")

	a.Devices[0] = prepared("a", a.Devices[0])
	if err := s.RecordCompleted(a, t0); err != nil {
		t.Fatal(err)
	}
	mustAction(intent("a", dev("gpu-0")), claimstate.ActionReturnRecorded)
	if err := s.RecordStarted(intent("b", dev("gpu-0")), t0); err == nil {
		t.Fatal("RecordStarted of a second claim on a prepared device succeeded")
	}

	// Unprepare frees the device.
	s.Remove("a")
	s.Remove("a") // removing twice is fine
	s.Remove("never-prepared")
	if len(s.Claims) != 0 {
		t.Fatalf("claims left after Remove: %v", s.Claims)
	}
	mustAction(intent("b", dev("gpu-0")), claimstate.ActionPrepare)
	if err := s.RecordStarted(intent("b", dev("gpu-0")), t0); err != nil {
		t.Fatalf("RecordStarted after the holder was removed: %v", err)
	}
}

func TestPlanSweep(t *testing.T) {
	const timeout = 2 * time.Minute
	now := t0.Add(time.Hour)
	startedAt := func(c *claimstate.Claim, at time.Time) *claimstate.Claim { c.StartedAt = at; return c }
	s := stateOf(
		startedAt(claim("s-old", claimstate.PrepareStarted, dev("gpu-0")), now.Add(-timeout-time.Second)),
		startedAt(claim("s-older", claimstate.PrepareStarted, dev("gpu-1")), now.Add(-time.Hour)),
		startedAt(claim("s-at-timeout", claimstate.PrepareStarted, dev("gpu-2")), now.Add(-timeout)),
		startedAt(claim("s-young", claimstate.PrepareStarted, dev("gpu-3")), now.Add(-time.Second)),
		startedAt(claim("s-future", claimstate.PrepareStarted, dev("gpu-4")), now.Add(time.Minute)),
		// Completed claims are released on gone alone, however old.
		startedAt(claim("c-gone", claimstate.PrepareCompleted, dev("gpu-5")), now.Add(-time.Second)),
		startedAt(claim("c-alive", claimstate.PrepareCompleted, dev("gpu-6")), now.Add(-24*time.Hour)),
		startedAt(claim("b-gone", claimstate.PrepareCompleted, dev("gpu-7")), now.Add(-time.Hour)),
	)
	gone := map[string]bool{"c-gone": true, "b-gone": true, "s-old": true, "s-young": true}
	before := s.Clone()

	for range 20 {
		var asked []string
		plan := s.PlanSweep(now, timeout, func(c *claimstate.Claim) bool {
			asked = append(asked, c.UID)
			return gone[c.UID]
		})
		if got, want := uids(plan.RollBack), []string{"s-old", "s-older"}; !reflect.DeepEqual(got, want) {
			t.Errorf("RollBack %v, want %v", got, want)
		}
		if got, want := uids(plan.Release), []string{"b-gone", "c-gone"}; !reflect.DeepEqual(got, want) {
			t.Errorf("Release %v, want %v", got, want)
		}
		if want := []string{"b-gone", "c-alive", "c-gone"}; !reflect.DeepEqual(asked, want) {
			t.Errorf("gone asked for %v, want only the completed claims, in order: %v", asked, want)
		}
		// The plan holds copies: acting on it cannot corrupt the state.
		plan.RollBack[0].Devices[0].Name = "changed"
		plan.Release[0].Phase = claimstate.PrepareStarted
		if !reflect.DeepEqual(s, before) {
			t.Fatal("PlanSweep's plan shares memory with the state, or PlanSweep changed it")
		}
	}

	empty := claimstate.New().PlanSweep(now, timeout, func(*claimstate.Claim) bool { t.Error("gone called on an empty state"); return true })
	if len(empty.RollBack) != 0 || len(empty.Release) != 0 {
		t.Errorf("plan for an empty state: %+v", empty)
	}
}

func uids(cs []*claimstate.Claim) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.UID)
	}
	return out
}

func TestPrepareActionString(t *testing.T) {
	tests := []struct {
		a    claimstate.PrepareAction
		want string
	}{
		{claimstate.ActionPrepare, "Prepare"},
		{claimstate.ActionRollbackThenPrepare, "RollbackThenPrepare"},
		{claimstate.ActionReturnRecorded, "ReturnRecorded"},
		{claimstate.PrepareAction(42), "PrepareAction(42)"},
	}
	for _, tt := range tests {
		if got := tt.a.String(); got != tt.want {
			t.Errorf("%d.String() = %q, want %q", int(tt.a), got, tt.want)
		}
	}
}

func TestConflictsByHardware(t *testing.T) {
	gpu := claimstate.Device{Pool: "n", Name: "gpu-1", UUID: "GPU-1"}
	for _, tc := range []struct {
		name     string
		held     claimstate.Device
		want     claimstate.Device
		conflict bool
	}{
		{"same GPU under a new name (minor changed)", gpu, claimstate.Device{Pool: "n", Name: "gpu-5", UUID: "GPU-1"}, true},
		{"MIG device of a held GPU", gpu, claimstate.Device{Pool: "n", Name: "gpu-1-mig-1g10gb-19-0", UUID: "MIG-a", ParentUUID: "GPU-1"}, true},
		{"GPU whose MIG device is held", claimstate.Device{Pool: "n", Name: "gpu-1-mig-1g10gb-19-0", UUID: "MIG-a", ParentUUID: "GPU-1"}, gpu, true},
		{"two MIG devices of one GPU", claimstate.Device{Pool: "n", Name: "m0", UUID: "MIG-a", ParentUUID: "GPU-1"}, claimstate.Device{Pool: "n", Name: "m1", UUID: "MIG-b", ParentUUID: "GPU-1"}, false},
		{"another GPU", gpu, claimstate.Device{Pool: "n", Name: "gpu-2", UUID: "GPU-2"}, false},
		{"hardware unknown on one side", claimstate.Device{Pool: "n", Name: "gpu-1"}, claimstate.Device{Pool: "n", Name: "gpu-2", UUID: "GPU-1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := claimstate.New()
			if err := s.RecordCompleted(claimstate.Intent{UID: "holder", Namespace: "ns", Name: "h", Devices: []claimstate.Device{tc.held}}, time.Now()); err != nil {
				t.Fatal(err)
			}
			err := s.RecordCompleted(claimstate.Intent{UID: "other", Namespace: "ns", Name: "o", Devices: []claimstate.Device{tc.want}}, time.Now())
			var conflict *claimstate.ConflictError
			if got := errors.As(err, &conflict); got != tc.conflict {
				t.Errorf("conflict = %v (%v), want %v", got, err, tc.conflict)
			}
		})
	}
}
