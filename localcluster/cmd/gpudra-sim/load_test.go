package main

import (
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/localcluster/controlplane"
)

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	for _, tc := range []struct {
		name string
		ds   []time.Duration
		p    int
		want time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one", ms(7), 99, 7 * time.Millisecond},
		{"median of odd count", ms(5, 1, 3), 50, 3 * time.Millisecond},
		{"p99 of 100 is the 99th", ms(seq(100)...), 99, 99 * time.Millisecond},
		{"p100 is the max", ms(seq(10)...), 100, 10 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := percentile(tc.ds, tc.p); got != tc.want {
				t.Errorf("percentile(%v, %d) = %v, want %v", tc.ds, tc.p, got, tc.want)
			}
		})
	}
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i + 1
	}
	return out
}

func TestPrintRequests(t *testing.T) {
	claim := controlplane.RequestKey{Component: "kube-scheduler", Verb: "update", Resource: "resourceclaims/status"}
	create := controlplane.RequestKey{Component: "gpudra-sim-load", Verb: "create", Resource: "pods"}
	var b strings.Builder
	printRequests(&b, 4, controlplane.RequestCounts{claim: 4, create: 4}, controlplane.RequestCounts{create: 4})
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("got %d lines, want header, column names, two kinds and the total:\n%s", len(lines), b.String())
	}
	for i, want := range [][]string{
		2: {"gpudra-sim-load", "create", "pods", "1.00", "1.00"},
		3: {"kube-scheduler", "update", "resourceclaims/status", "1.00", "0.00"},
		4: {"all", "2.00", "1.00"},
	} {
		if want != nil && strings.Join(strings.Fields(lines[i]), " ") != strings.Join(want, " ") {
			t.Errorf("line %d = %q, want fields %v", i, lines[i], want)
		}
	}
}
