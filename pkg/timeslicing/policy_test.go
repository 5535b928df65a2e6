package timeslicing_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/timeslicing"
)

const (
	gpu1 = "GPU-11111111-2222-3333-4444-555555555555"
	gpu2 = "GPU-66666666-7777-8888-9999-000000000000"
)

const (
	deflt  = v1beta1.DefaultTimeSlice
	short  = v1beta1.ShortTimeSlice
	medium = v1beta1.MediumTimeSlice
	long   = v1beta1.LongTimeSlice
)

func claim(uid string) timeslicing.Claim {
	return timeslicing.Claim{UID: uid, Namespace: "ns", Name: "claim-" + uid}
}

func rec(gpu, uid string, iv v1beta1.TimeSliceInterval) timeslicing.Record {
	return timeslicing.Record{GPU: gpu, Claim: claim(uid), Interval: iv}
}

func set(gpu string, iv v1beta1.TimeSliceInterval) timeslicing.Step {
	return timeslicing.Step{GPU: gpu, Interval: iv, Set: true}
}

func keep(gpu string, iv v1beta1.TimeSliceInterval) timeslicing.Step {
	return timeslicing.Step{GPU: gpu, Interval: iv}
}

// policyOf rebuilds a policy from records that must not conflict.
func policyOf(t *testing.T, records ...timeslicing.Record) *timeslicing.Policy {
	t.Helper()
	p, err := timeslicing.Rebuild(records)
	if err != nil {
		t.Fatalf("Rebuild(%v): %v", records, err)
	}
	return p
}

func wantRecords(t *testing.T, p *timeslicing.Policy, want ...timeslicing.Record) {
	t.Helper()
	if got := p.Records(); !reflect.DeepEqual(got, want) && (len(got) > 0 || len(want) > 0) {
		t.Errorf("records:\n got %v\nwant %v", got, want)
	}
}

// conflictMsg is the message for claim "b" (or the holder itself) asking
// for want on gpu1 while holder holds inForce.
func conflictMsg(want v1beta1.TimeSliceInterval, inForce v1beta1.TimeSliceInterval, holder string) string {
	return `sharing.timeSlicingConfig.interval: Invalid value: "` + string(want) + `": GPU ` + gpu1 +
		` is already time-sliced with interval "` + string(inForce) + `" for claim ns/claim-` + holder + ` (uid ` + holder +
		`); the interval applies to the whole GPU, so all claims sharing it must ask for the same one (allowed values: "Default", "Short", "Medium", "Long"): ask for "` +
		string(inForce) + `", or wait until that claim is unprepared`
}

func TestAcquire(t *testing.T) {
	tests := []struct {
		name     string
		held     []timeslicing.Record
		gpu      string
		claim    timeslicing.Claim
		interval v1beta1.TimeSliceInterval
		want     timeslicing.Step
		// wantErr is the exact message; the records then stay as held.
		wantErr string
		// wantConflict is the holder UID of a *ConflictError.
		wantConflict string
		wantRecords  []timeslicing.Record
	}{
		{
			name: "first claim on a GPU sets its interval",
			gpu:  gpu1, claim: claim("a"), interval: short,
			want:        set(gpu1, short),
			wantRecords: []timeslicing.Record{rec(gpu1, "a", short)},
		},
		{
			name: "first claim asking for Default sets Default: the GPU's setting is unknown",
			gpu:  gpu1, claim: claim("a"), interval: deflt,
			want:        set(gpu1, deflt),
			wantRecords: []timeslicing.Record{rec(gpu1, "a", deflt)},
		},
		{
			name: "second claim with the same interval joins without a step",
			held: []timeslicing.Record{rec(gpu1, "a", medium)},
			gpu:  gpu1, claim: claim("b"), interval: medium,
			want:        keep(gpu1, medium),
			wantRecords: []timeslicing.Record{rec(gpu1, "a", medium), rec(gpu1, "b", medium)},
		},
		{
			name: "second claim with another interval is refused",
			held: []timeslicing.Record{rec(gpu1, "a", short)},
			gpu:  gpu1, claim: claim("b"), interval: long,
			wantErr:      conflictMsg(long, short, "a"),
			wantConflict: "a",
		},
		{
			name: "a held Default conflicts with another interval",
			held: []timeslicing.Record{rec(gpu1, "a", deflt)},
			gpu:  gpu1, claim: claim("b"), interval: short,
			wantErr:      conflictMsg(short, deflt, "a"),
			wantConflict: "a",
		},
		{
			name: "Default conflicts with another interval in force",
			held: []timeslicing.Record{rec(gpu1, "a", long)},
			gpu:  gpu1, claim: claim("b"), interval: deflt,
			wantErr:      conflictMsg(deflt, long, "a"),
			wantConflict: "a",
		},
		{
			name: "a conflict names the holder with the smallest UID",
			held: []timeslicing.Record{rec(gpu1, "z", short), rec(gpu1, "c", short)},
			gpu:  gpu1, claim: claim("b"), interval: long,
			wantErr:      conflictMsg(long, short, "c"),
			wantConflict: "c",
		},
		{
			name: "a holder without a name is named by UID",
			held: []timeslicing.Record{{GPU: gpu1, Claim: timeslicing.Claim{UID: "a"}, Interval: short}},
			gpu:  gpu1, claim: claim("b"), interval: long,
			wantErr: `sharing.timeSlicingConfig.interval: Invalid value: "Long": GPU ` + gpu1 +
				` is already time-sliced with interval "Short" for claim uid a; the interval applies to the whole GPU, so all claims sharing it must ask for the same one (allowed values: "Default", "Short", "Medium", "Long"): ask for "Short", or wait until that claim is unprepared`,
			wantConflict: "a",
		},
		{
			name: "the same claim again with the same interval changes nothing",
			held: []timeslicing.Record{rec(gpu1, "a", short), rec(gpu1, "b", short)},
			gpu:  gpu1, claim: claim("a"), interval: short,
			want:        keep(gpu1, short),
			wantRecords: []timeslicing.Record{rec(gpu1, "a", short), rec(gpu1, "b", short)},
		},
		{
			name: "the same claim with another interval on the same GPU is refused",
			held: []timeslicing.Record{rec(gpu1, "a", short)},
			gpu:  gpu1, claim: claim("a"), interval: medium,
			wantErr: `sharing.timeSlicingConfig.interval: Invalid value: "Medium": another config of the same claim asks for interval "Short" on GPU ` + gpu1 +
				`; the interval applies to the whole GPU, so every config of a claim that applies to it must ask for the same one (allowed values: "Default", "Short", "Medium", "Long")`,
			wantConflict: "a",
		},
		{
			name: "another GPU is independent",
			held: []timeslicing.Record{rec(gpu1, "a", short)},
			gpu:  gpu2, claim: claim("b"), interval: long,
			want:        set(gpu2, long),
			wantRecords: []timeslicing.Record{rec(gpu1, "a", short), rec(gpu2, "b", long)},
		},
		{
			name: "a holder restored without a name learns it",
			held: []timeslicing.Record{{GPU: gpu1, Claim: timeslicing.Claim{UID: "a"}, Interval: short}},
			gpu:  gpu1, claim: claim("a"), interval: short,
			want:        keep(gpu1, short),
			wantRecords: []timeslicing.Record{rec(gpu1, "a", short)},
		},
		{
			name: "an unknown interval is refused with the allowed values",
			gpu:  gpu1, claim: claim("a"), interval: "Fast",
			wantErr: `sharing.timeSlicingConfig.interval: Unsupported value: "Fast": supported values: "Default", "Short", "Medium", "Long"`,
		},
		{
			name: "an empty interval is refused",
			held: []timeslicing.Record{rec(gpu1, "a", short)},
			gpu:  gpu1, claim: claim("b"), interval: "",
			wantErr: `sharing.timeSlicingConfig.interval: Unsupported value: "": supported values: "Default", "Short", "Medium", "Long"`,
		},
		{
			name: "no GPU UUID",
			gpu:  "", claim: claim("a"), interval: short,
			wantErr: "time-slice hold without a GPU UUID",
		},
		{
			name: "no claim UID",
			gpu:  gpu1, claim: timeslicing.Claim{Namespace: "ns", Name: "x"}, interval: short,
			wantErr: "time-slice hold on GPU " + gpu1 + " without a claim UID",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := policyOf(t, tt.held...)
			got, err := p.Acquire(tt.gpu, tt.claim, tt.interval)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("error:\n got %v\nwant %s", err, tt.wantErr)
				}
				if got != (timeslicing.Step{}) {
					t.Errorf("step %+v with an error, want the zero Step", got)
				}
				var conflict *timeslicing.ConflictError
				if isConflict := errors.As(err, &conflict); isConflict != (tt.wantConflict != "") {
					t.Fatalf("errors.As(*ConflictError) = %v, want %v", isConflict, tt.wantConflict != "")
				}
				if conflict != nil {
					want := timeslicing.ConflictError{GPU: tt.gpu, Claim: tt.claim, Requested: tt.interval, InForce: tt.held[0].Interval, Holder: conflict.Holder}
					if *conflict != want || conflict.Holder.UID != tt.wantConflict {
						t.Errorf("conflict %+v, want %+v held by %s", *conflict, want, tt.wantConflict)
					}
				}
				wantRecords(t, p, policyOf(t, tt.held...).Records()...)
				return
			}
			if err != nil {
				t.Fatalf("Acquire: %v", err)
			}
			if got != tt.want {
				t.Errorf("step %+v, want %+v", got, tt.want)
			}
			wantRecords(t, p, tt.wantRecords...)
		})
	}
}

func TestRelease(t *testing.T) {
	tests := []struct {
		name        string
		held        []timeslicing.Record
		gpu, claim  string
		want        timeslicing.Step
		wantRecords []timeslicing.Record
	}{
		{
			name: "one of two leaves: the interval stays, no step",
			held: []timeslicing.Record{rec(gpu1, "a", long), rec(gpu1, "b", long)},
			gpu:  gpu1, claim: "a",
			want:        keep(gpu1, long),
			wantRecords: []timeslicing.Record{rec(gpu1, "b", long)},
		},
		{
			name: "the last holder leaves: reset to Default",
			held: []timeslicing.Record{rec(gpu1, "a", short), rec(gpu2, "b", medium)},
			gpu:  gpu1, claim: "a",
			want:        set(gpu1, deflt),
			wantRecords: []timeslicing.Record{rec(gpu2, "b", medium)},
		},
		{
			name: "the last holder of Default leaves: nothing to reset",
			held: []timeslicing.Record{rec(gpu1, "a", deflt)},
			gpu:  gpu1, claim: "a",
			want: keep(gpu1, deflt),
		},
		{
			name: "an unknown claim on a held GPU changes nothing",
			held: []timeslicing.Record{rec(gpu1, "a", short)},
			gpu:  gpu1, claim: "x",
			want:        keep(gpu1, short),
			wantRecords: []timeslicing.Record{rec(gpu1, "a", short)},
		},
		{
			name: "a claim on a GPU nobody holds changes nothing",
			held: []timeslicing.Record{rec(gpu1, "a", short)},
			gpu:  gpu2, claim: "a",
			want:        keep(gpu2, deflt),
			wantRecords: []timeslicing.Record{rec(gpu1, "a", short)},
		},
		{
			name: "an empty policy",
			gpu:  gpu1, claim: "a",
			want: keep(gpu1, deflt),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := policyOf(t, tt.held...)
			if got := p.Release(tt.gpu, tt.claim); got != tt.want {
				t.Errorf("step %+v, want %+v", got, tt.want)
			}
			wantRecords(t, p, tt.wantRecords...)
		})
	}
}

// op is one call in a scripted sequence; release is set for Release.
type op struct {
	release  bool
	gpu      string
	claim    string
	interval v1beta1.TimeSliceInterval
	want     timeslicing.Step
	// conflict is the holder UID of an expected *ConflictError.
	conflict string
}

func acquire(gpu, uid string, iv v1beta1.TimeSliceInterval, want timeslicing.Step) op {
	return op{gpu: gpu, claim: uid, interval: iv, want: want}
}

func refused(gpu, uid string, iv v1beta1.TimeSliceInterval, holder string) op {
	return op{gpu: gpu, claim: uid, interval: iv, conflict: holder}
}

func release(gpu, uid string, want timeslicing.Step) op {
	return op{release: true, gpu: gpu, claim: uid, want: want}
}

// TestSequences plays the lives of several claims on shared GPUs and
// checks every step, and that a policy rebuilt from the records at any
// point gives the same answers as the one that lived through it.
func TestSequences(t *testing.T) {
	tests := []struct {
		name string
		ops  []op
	}{
		{
			name: "claims come and go",
			ops: []op{
				acquire(gpu1, "a", short, set(gpu1, short)),
				acquire(gpu1, "b", short, keep(gpu1, short)),
				refused(gpu1, "c", long, "a"),
				acquire(gpu1, "a", short, keep(gpu1, short)),
				release(gpu1, "a", keep(gpu1, short)),
				release(gpu1, "a", keep(gpu1, short)),
				refused(gpu1, "c", long, "b"),
				release(gpu1, "b", set(gpu1, deflt)),
				release(gpu1, "b", keep(gpu1, deflt)),
				acquire(gpu1, "c", long, set(gpu1, long)),
				acquire(gpu1, "c", long, keep(gpu1, long)),
				release(gpu1, "c", set(gpu1, deflt)),
			},
		},
		{
			name: "an Acquire whose step failed is rolled back by Release",
			ops: []op{
				acquire(gpu1, "a", medium, set(gpu1, medium)),
				// Setting Medium failed: the plugin releases and resets.
				release(gpu1, "a", set(gpu1, deflt)),
				acquire(gpu1, "a", medium, set(gpu1, medium)),
				release(gpu1, "a", set(gpu1, deflt)),
			},
		},
		{
			name: "two GPUs, one claim on both",
			ops: []op{
				acquire(gpu1, "a", long, set(gpu1, long)),
				acquire(gpu2, "a", long, set(gpu2, long)),
				acquire(gpu2, "b", long, keep(gpu2, long)),
				refused(gpu1, "c", short, "a"),
				acquire(gpu1, "c", long, keep(gpu1, long)),
				release(gpu1, "a", keep(gpu1, long)),
				release(gpu2, "a", keep(gpu2, long)),
				release(gpu2, "b", set(gpu2, deflt)),
				release(gpu1, "c", set(gpu1, deflt)),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := timeslicing.New()
			for i, o := range tt.ops {
				// A restart before this call must not change its answer.
				restarted := policyOf(t, p.Records()...)
				for _, pol := range []*timeslicing.Policy{p, restarted} {
					var got timeslicing.Step
					var err error
					if o.release {
						got = pol.Release(o.gpu, o.claim)
					} else {
						got, err = pol.Acquire(o.gpu, claim(o.claim), o.interval)
					}
					var conflict *timeslicing.ConflictError
					switch {
					case o.conflict != "":
						if !errors.As(err, &conflict) || conflict.Holder.UID != o.conflict {
							t.Fatalf("op %d %+v: error %v, want a conflict with %s", i, o, err, o.conflict)
						}
					case err != nil:
						t.Fatalf("op %d %+v: %v", i, o, err)
					case got != o.want:
						t.Fatalf("op %d %+v: step %+v, want %+v", i, o, got, o.want)
					}
				}
				wantRecords(t, restarted, p.Records()...)
			}
			wantRecords(t, p)
		})
	}
}

func TestRebuild(t *testing.T) {
	tests := []struct {
		name        string
		records     []timeslicing.Record
		wantRecords []timeslicing.Record
		wantErr     string
	}{
		{
			name:    "records in any order",
			records: []timeslicing.Record{rec(gpu2, "c", deflt), rec(gpu1, "b", short), rec(gpu1, "a", short)},
			wantRecords: []timeslicing.Record{
				rec(gpu1, "a", short), rec(gpu1, "b", short), rec(gpu2, "c", deflt),
			},
		},
		{
			name:        "a duplicate record is one hold",
			records:     []timeslicing.Record{rec(gpu1, "a", short), rec(gpu1, "a", short)},
			wantRecords: []timeslicing.Record{rec(gpu1, "a", short)},
		},
		{
			name:        "conflicting records: the smaller claim UID keeps the GPU",
			records:     []timeslicing.Record{rec(gpu1, "b", long), rec(gpu1, "a", short), rec(gpu2, "c", medium)},
			wantRecords: []timeslicing.Record{rec(gpu1, "a", short), rec(gpu2, "c", medium)},
			wantErr: `record of claim ns/claim-b (uid b) on GPU "` + gpu1 + `" left out: ` +
				`sharing.timeSlicingConfig.interval: Invalid value: "Long": GPU ` + gpu1 +
				` is already time-sliced with interval "Short" for claim ns/claim-a (uid a); the interval applies to the whole GPU, so all claims sharing it must ask for the same one (allowed values: "Default", "Short", "Medium", "Long"): ask for "Short", or wait until that claim is unprepared`,
		},
		{
			name:        "malformed records are left out",
			records:     []timeslicing.Record{rec("", "a", short), rec(gpu1, "b", "Fast"), rec(gpu2, "c", long)},
			wantRecords: []timeslicing.Record{rec(gpu2, "c", long)},
			wantErr: `record of claim ns/claim-a (uid a) on GPU "" left out: time-slice hold without a GPU UUID` + "\n" +
				`record of claim ns/claim-b (uid b) on GPU "` + gpu1 + `" left out: sharing.timeSlicingConfig.interval: Unsupported value: "Fast": supported values: "Default", "Short", "Medium", "Long"`,
		},
		{
			name: "no records",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			input := append([]timeslicing.Record(nil), tt.records...)
			p, err := timeslicing.Rebuild(tt.records)
			if gotErr := errString(err); gotErr != tt.wantErr {
				t.Errorf("error:\n got %s\nwant %s", gotErr, tt.wantErr)
			}
			if p == nil {
				t.Fatal("Rebuild returned no policy")
			}
			wantRecords(t, p, tt.wantRecords...)
			if !reflect.DeepEqual(tt.records, input) {
				t.Errorf("Rebuild reordered its input: %v", tt.records)
			}
		})
	}
}

// TestRebuildThenContinue restores the policy a plugin checkpointed and
// goes on where it left off: the restored holders still conflict, are
// named, and the last release still resets.
func TestRebuildThenContinue(t *testing.T) {
	before := timeslicing.New()
	for _, r := range []timeslicing.Record{rec(gpu1, "a", long), rec(gpu1, "b", long), rec(gpu2, "c", deflt)} {
		if _, err := before.Acquire(r.GPU, r.Claim, r.Interval); err != nil {
			t.Fatal(err)
		}
	}
	p := policyOf(t, before.Records()...)

	if got, want := p.Reapply(), []timeslicing.Step{set(gpu1, long), set(gpu2, deflt)}; !reflect.DeepEqual(got, want) {
		t.Errorf("Reapply() = %+v, want %+v", got, want)
	}
	if iv, ok := p.InForce(gpu1); iv != long || !ok {
		t.Errorf("InForce(gpu1) = %q, %v; want Long, true", iv, ok)
	}
	if _, err := p.Acquire(gpu1, claim("d"), short); err == nil || err.Error() != conflictMsg(short, long, "a") {
		t.Errorf("Acquire Short on gpu1: %v, want %s", err, conflictMsg(short, long, "a"))
	}
	if _, err := p.Acquire(gpu2, claim("d"), short); err == nil {
		t.Error("Acquire Short on gpu2 where Default is held: no error")
	}
	if got := p.Release(gpu1, "a"); got != keep(gpu1, long) {
		t.Errorf("Release a: %+v", got)
	}
	if got := p.Release(gpu1, "b"); got != set(gpu1, deflt) {
		t.Errorf("Release b: %+v, want a reset", got)
	}
	if got, err := p.Acquire(gpu1, claim("d"), short); err != nil || got != set(gpu1, short) {
		t.Errorf("Acquire Short on the freed gpu1: %+v, %v", got, err)
	}
	if iv, ok := p.InForce(gpu1); iv != short || !ok {
		t.Errorf("InForce(gpu1) = %q, %v; want Short, true", iv, ok)
	}
	if got := p.Release(gpu2, "c"); got != keep(gpu2, deflt) {
		t.Errorf("Release c: %+v, want no step (Default was in force)", got)
	}
	if iv, ok := p.InForce(gpu2); iv != "" || ok {
		t.Errorf("InForce(gpu2) = %q, %v; want nothing", iv, ok)
	}
	wantRecords(t, p, rec(gpu1, "d", short))
	wantRecords(t, before, rec(gpu1, "a", long), rec(gpu1, "b", long), rec(gpu2, "c", deflt))
}

func TestClone(t *testing.T) {
	p := policyOf(t, rec(gpu1, "a", short))
	c := p.Clone()
	if _, err := c.Acquire(gpu1, claim("b"), short); err != nil {
		t.Fatal(err)
	}
	c.Release(gpu1, "a")
	if _, err := c.Acquire(gpu2, claim("c"), long); err != nil {
		t.Fatal(err)
	}
	wantRecords(t, p, rec(gpu1, "a", short))
	wantRecords(t, c, rec(gpu1, "b", short), rec(gpu2, "c", long))
}

func TestClaimString(t *testing.T) {
	tests := []struct {
		claim timeslicing.Claim
		want  string
	}{
		{claim("a"), "ns/claim-a (uid a)"},
		{timeslicing.Claim{UID: "a"}, "uid a"},
	}
	for _, tt := range tests {
		if got := tt.claim.String(); got != tt.want {
			t.Errorf("%+v.String() = %q, want %q", tt.claim, got, tt.want)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
