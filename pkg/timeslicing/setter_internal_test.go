package timeslicing

import (
	"reflect"
	"strings"
	"testing"
)

func TestWithPreload(t *testing.T) {
	const lib = "/driver-root/usr/lib64/libnvidia-ml.so.1"
	tests := []struct {
		name string
		env  []string
		path string
		want []string
	}{
		{
			name: "no library keeps the environment",
			env:  []string{"PATH=/bin", "LD_PRELOAD=/a.so"},
			want: []string{"PATH=/bin", "LD_PRELOAD=/a.so"},
		},
		{
			name: "added",
			env:  []string{"PATH=/bin"},
			path: lib,
			want: []string{"PATH=/bin", "LD_PRELOAD=" + lib},
		},
		{
			name: "put first, the plugin's own preload kept",
			env:  []string{"LD_PRELOAD=/a.so", "PATH=/bin"},
			path: lib,
			want: []string{"PATH=/bin", "LD_PRELOAD=" + lib + ":/a.so"},
		},
		{
			name: "an empty preload replaced",
			env:  []string{"LD_PRELOAD=", "PATH=/bin"},
			path: lib,
			want: []string{"PATH=/bin", "LD_PRELOAD=" + lib},
		},
		{
			name: "a similar name left alone",
			env:  []string{"LD_PRELOAD_X=1"},
			path: lib,
			want: []string{"LD_PRELOAD_X=1", "LD_PRELOAD=" + lib},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := withPreload(tt.env, tt.path); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("withPreload(%q, %q) = %q, want %q", tt.env, tt.path, got, tt.want)
			}
		})
	}
}

func TestDescribeOutput(t *testing.T) {
	tests := []struct {
		name string
		out  string
		want string
	}{
		{"none", "", "no output"},
		{"blank", " \n\t\n", "no output"},
		{"one line on one line", "Insufficient Permissions\n", `output: "Insufficient Permissions"`},
		{"lines on one line", "a\nb\n", `output: "a\nb"`},
		{"capped", strings.Repeat("x", maxOutput+10), `output: "` + strings.Repeat("x", maxOutput) + `..."`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := describeOutput([]byte(tt.out)); got != tt.want {
				t.Errorf("describeOutput(%q) = %s, want %s", tt.out, got, tt.want)
			}
		})
	}
}
