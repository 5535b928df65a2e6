package controller

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

func TestChannelAssigner(t *testing.T) {
	a := NewChannelAssigner(3)
	for i, tc := range []struct {
		uid     types.UID
		want    int32
		wantErr string
	}{
		{uid: "a", want: 0},
		{uid: "b", want: 1},
		{uid: "a", want: 0}, // stable
		{uid: "c", want: 2},
		{uid: "d", wantErr: "all 3 IMEX channels are held"},
	} {
		got, err := a.Assign(tc.uid)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%d: Assign(%s) = %d, %v; want error %q", i, tc.uid, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%d: Assign(%s) = %d, %v; want %d", i, tc.uid, got, err, tc.want)
		}
	}
	a.Release("b")
	if got, err := a.Assign("d"); err != nil || got != 1 {
		t.Errorf("after b left: Assign(d) = %d, %v; want 1 (the freed channel)", got, err)
	}
}

func TestSeedChannels(t *testing.T) {
	at := func(sec int64) metav1.Time { return metav1.NewTime(time.Unix(sec, 0)) }
	n := func(c int32) *int32 { return &c }
	domains := []*v1beta1.ComputeDomain{
		{ObjectMeta: metav1.ObjectMeta{UID: "newer", CreationTimestamp: at(2)}, Status: v1beta1.ComputeDomainStatus{Channel: n(0)}},
		{ObjectMeta: metav1.ObjectMeta{UID: "older", CreationTimestamp: at(1)}, Status: v1beta1.ComputeDomainStatus{Channel: n(0)}},
		{ObjectMeta: metav1.ObjectMeta{UID: "other", CreationTimestamp: at(3)}, Status: v1beta1.ComputeDomainStatus{Channel: n(1)}},
		{ObjectMeta: metav1.ObjectMeta{UID: "fresh", CreationTimestamp: at(4)}},
	}
	a, conflicts := SeedChannels(8, domains)
	if len(conflicts) != 1 || conflicts[0].UID != "newer" {
		t.Fatalf("conflicts %v, want the newer of the two holders of channel 0", conflicts)
	}
	if got, _ := a.Assign("older"); got != 0 {
		t.Errorf("older keeps %d, want 0", got)
	}
	if got, _ := a.Assign("fresh"); got != 2 {
		t.Errorf("fresh gets %d, want 2", got)
	}
	if got, _ := a.Assign("newer"); got != 3 {
		t.Errorf("newer is reassigned %d, want 3", got)
	}
}
