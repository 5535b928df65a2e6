package mps

import (
	"slices"
	"strings"
	"testing"
)

func TestMemLimits(t *testing.T) {
	args := []struct {
		bytes int64
		want  string
	}{
		{MiB, "1M"},
		{MiB + MiB/2, "1M"}, // rounded down: a cap never grows
		{10 << 30, "10240M"},
	}
	for _, a := range args {
		if got := memLimitArg(a.bytes); got != a.want {
			t.Errorf("memLimitArg(%d) = %q, want %q", a.bytes, got, a.want)
		}
	}
	shows := []struct {
		out     string
		wantMiB int64
		ok      bool
	}{
		{"512M", 512, true},
		{"10240M", 10240, true},
		{"10G", 10240, true},
		{"1G", 1536, true}, // the driver shows whole G, rounded down
		{"2G", 1536, false},
		{"0G", 512, false},
		{"512", 512, false},
		{"", 512, false},
		{"Invalid device", 512, false},
	}
	for _, s := range shows {
		if got := memLimitShows(s.out, s.wantMiB); got != s.ok {
			t.Errorf("memLimitShows(%q, %d) = %v, want %v", s.out, s.wantMiB, got, s.ok)
		}
	}
}

func TestSpecEqual(t *testing.T) {
	p := func(n int) *int { return &n }
	base := Spec{ID: "c", DeviceUUIDs: []string{"GPU-a", "GPU-b"}, ActiveThreadPercentage: p(50), PinnedMemoryLimits: map[string]int64{"GPU-a": MiB}}
	tests := []struct {
		name  string
		other func(s Spec) Spec
		equal bool
	}{
		{"same", func(s Spec) Spec { return s.clone() }, true},
		{"other percentage", func(s Spec) Spec { s = s.clone(); *s.ActiveThreadPercentage = 51; return s }, false},
		{"no percentage", func(s Spec) Spec { s = s.clone(); s.ActiveThreadPercentage = nil; return s }, false},
		{"device order", func(s Spec) Spec { s = s.clone(); slices.Reverse(s.DeviceUUIDs); return s }, false},
		{"other limit", func(s Spec) Spec { s = s.clone(); s.PinnedMemoryLimits["GPU-a"] = 2 * MiB; return s }, false},
		{"multi-user", func(s Spec) Spec { s = s.clone(); s.MultiUser = true; return s }, false},
	}
	for _, tc := range tests {
		if got := base.Equal(tc.other(base)); got != tc.equal {
			t.Errorf("%s: Equal = %v, want %v", tc.name, got, tc.equal)
		}
	}
	if !(Spec{ID: "c", PinnedMemoryLimits: map[string]int64{}}).Equal(Spec{ID: "c"}) {
		t.Error("an empty and a nil limit map differ")
	}
}

func TestSystemdRun(t *testing.T) {
	req := LaunchRequest{
		ID:   "claim-1",
		Argv: []string{"/usr/bin/nvidia-cuda-mps-control", "-d", "-M"},
		Env:  []string{"CUDA_MPS_PIPE_DIRECTORY=/run/gpudra/mps/claim-1/pipe", "CUDA_VISIBLE_DEVICES=GPU-a"},
		Dirs: dirsFor("/run/gpudra/mps", "claim-1"),
	}
	tests := []struct {
		name string
		opts SystemdRunOptions
		want []string
	}{
		{
			name: "on the host",
			opts: SystemdRunOptions{SystemdRunPath: "/usr/bin/systemd-run"},
			want: []string{"/usr/bin/systemd-run", "--unit=gpudra-mps-claim-1", "--collect", "--quiet", "--service-type=forking",
				"--property=PIDFile=/run/gpudra/mps/claim-1/pipe/nvidia-cuda-mps-control.pid",
				"--property=BindPaths=/run/gpudra/mps/claim-1/shm:/dev/shm",
				"--setenv=CUDA_MPS_PIPE_DIRECTORY=/run/gpudra/mps/claim-1/pipe", "--setenv=CUDA_VISIBLE_DEVICES=GPU-a",
				"--", "/usr/bin/nvidia-cuda-mps-control", "-d", "-M"},
		},
		{
			name: "from a container",
			opts: SystemdRunOptions{NsenterPath: "/usr/bin/nsenter", SystemdRunPath: "/usr/bin/systemd-run", UnitPrefix: "mps-"},
			want: []string{"/usr/bin/nsenter", "--target=1", "--mount", "--uts", "--ipc", "--net", "--pid", "--",
				"/usr/bin/systemd-run", "--unit=mps-claim-1", "--collect", "--quiet", "--service-type=forking",
				"--property=PIDFile=/run/gpudra/mps/claim-1/pipe/nvidia-cuda-mps-control.pid",
				"--property=BindPaths=/run/gpudra/mps/claim-1/shm:/dev/shm",
				"--setenv=CUDA_MPS_PIPE_DIRECTORY=/run/gpudra/mps/claim-1/pipe", "--setenv=CUDA_VISIBLE_DEVICES=GPU-a",
				"--", "/usr/bin/nvidia-cuda-mps-control", "-d", "-M"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			argv, env := SystemdRun(tc.opts)(req)
			if !slices.Equal(argv, tc.want) {
				t.Errorf("argv =\n%q\nwant\n%q", argv, tc.want)
			}
			if slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "CUDA_") }) {
				t.Errorf("systemd-run's own environment carries the daemon's: %v", env)
			}
		})
	}
}
