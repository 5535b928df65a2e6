package loadrun

import (
	"context"
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

// TestRunRefusesBadOptions: a load run with options it cannot honour
// stops before it starts a cluster, naming the option by its flag.
func TestRunRefusesBadOptions(t *testing.T) {
	valid := DefaultOptions(8)
	valid.Nodes, valid.Rounds, valid.RoundTimeout = 1, 1, time.Minute
	for _, tc := range []struct {
		name    string
		edit    func(*Options)
		wantErr string
	}{
		{"no rounds", func(o *Options) { o.Rounds = 0 }, "--rounds 0: must be at least 1"},
		{"no timeout", func(o *Options) { o.RoundTimeout = 0 }, "--round-timeout 0s: must be positive"},
		{"more pods than GPUs", func(o *Options) { o.Pods = 9 }, "--pods 9 is more than the 8 GPUs of 1 nodes"},
		{"gpudra's name", func(o *Options) { o.BaselineDriver = "gpu.nvidia.com" }, "must differ from gpudra's driver name"},
		{"no mix", func(o *Options) { o.Mix = "" }, `--mix "": must be one of gpu, mixed`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := valid
			tc.edit(&o)
			res, err := Run(context.Background(), o)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Run = %v, %v; want an error with %q", res, err, tc.wantErr)
			}
		})
	}
}
