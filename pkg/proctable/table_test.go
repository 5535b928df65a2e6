package proctable

import (
	"slices"
	"strings"
	"testing"
)

func TestParseProcStat(t *testing.T) {
	tail := " 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 4242 0 0" // fields 7 to 24; starttime is 22
	tests := []struct {
		name    string
		in      string
		want    Stat
		wantErr string
	}{
		{name: "plain", in: "123 (nvidia-cuda-mps) S 1 123 123" + tail, want: Stat{State: 'S', PPID: 1, StartTime: 4242}},
		{name: "command with spaces and parentheses", in: "7 (a) b (c) d) Z 99 7 7" + tail, want: Stat{State: 'Z', PPID: 99, StartTime: 4242}},
		{name: "no command", in: "7 S 1", wantErr: "no ')'"},
		{name: "truncated", in: "7 (x) S 1 2 3", wantErr: "fields"},
		{name: "bad start time", in: "7 (x) S 1 7 7" + strings.Replace(tail, "4242", "-1", 1), wantErr: "starttime"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseStat([]byte(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestMergeEnv(t *testing.T) {
	got := MergeEnv([]string{"PATH=/bin", "CUDA_MPS_PIPE_DIRECTORY=/old", "HOME=/root"}, []string{"CUDA_MPS_PIPE_DIRECTORY=/new", "X=1"})
	want := []string{"PATH=/bin", "HOME=/root", "CUDA_MPS_PIPE_DIRECTORY=/new", "X=1"}
	if !slices.Equal(got, want) {
		t.Errorf("MergeEnv = %v, want %v", got, want)
	}
}
