package controlplane

import (
	"runtime/debug"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/version"
	basecompatibility "k8s.io/component-base/compatibility"
)

func TestKubernetesVersion(t *testing.T) {
	mod := func(path, v string, replace ...string) *debug.Module {
		m := &debug.Module{Path: path, Version: v}
		if len(replace) == 2 {
			m.Replace = &debug.Module{Path: replace[0], Version: replace[1]}
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		deps    []*debug.Module
		want    string
		wantErr string
	}{
		{"kubernetes module", []*debug.Module{mod("k8s.io/apiserver", "v0.37.1"), mod("k8s.io/kubernetes", "v1.37.1")}, "v1.37.1", ""},
		{"kubernetes replaced", []*debug.Module{mod("k8s.io/kubernetes", "v1.36.0", "k8s.io/kubernetes", "v1.37.1")}, "v1.37.1", ""},
		{"kubernetes pseudo-version", []*debug.Module{mod("k8s.io/kubernetes", "v1.38.0-alpha.0.20261101120000-0123456789ab")}, "v1.38.0-alpha.0.20261101120000-0123456789ab", ""},
		// The staging modules are required at v0.0.0 and replaced, as in
		// k8s.io/kubernetes' own go.mod.
		{"staging only", []*debug.Module{mod("k8s.io/apiserver", "v0.0.0", "k8s.io/apiserver", "v0.37.1")}, "v1.37.1", ""},
		{"staging pre-release", []*debug.Module{mod("k8s.io/apiserver", "v0.38.0-rc.1")}, "v1.38.0-rc.1", ""},
		{"local replacement", []*debug.Module{mod("k8s.io/apiserver", "v0.0.0", "../apiserver", "")}, "", "neither"},
		{"no kubernetes", []*debug.Module{mod("example.com/x", "v1.0.0")}, "", "neither"},
		{"bad kubernetes version", []*debug.Module{mod("k8s.io/kubernetes", "v0.37.1")}, "", "not a Kubernetes 1.x version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := kubernetesVersion(tc.deps)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %q, %v; want an error containing %q", got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
			if _, err := version.ParseSemantic(got); err != nil {
				t.Errorf("%q does not parse: %v", got, err)
			}
		})
	}
}

func TestServedVersionInfo(t *testing.T) {
	ev := basecompatibility.NewEffectiveVersionFromString("1.37", "1.34", "1.34")
	sv, err := newServedVersion(ev, "v1.37.1")
	if err != nil {
		t.Fatal(err)
	}
	info := sv.Info()
	if info.GitVersion != "v1.37.1" || info.Major != "1" || info.Minor != "37" || info.Platform == "" || strings.Contains(info.GitCommit, "$") {
		t.Errorf("Info() = %+v; want gitVersion v1.37.1, major 1, minor 37, a platform and no placeholder commit", info)
	}
	if info.EmulationMinor != "37" {
		t.Errorf("emulation minor %q, want the wrapped version's 37", info.EmulationMinor)
	}
	if _, err := newServedVersion(ev, "v0.0.0-master+$Format:%H$"); err == nil {
		t.Error("the unstamped placeholder was accepted as a version")
	}
}

func TestVersionFromSourcePath(t *testing.T) {
	for _, tc := range []struct {
		file, want string
		ok         bool
	}{
		{"/root/go/pkg/mod/k8s.io/kubernetes@v1.37.1/cmd/kube-apiserver/app/config.go", "v1.37.1", true},
		{"k8s.io/kubernetes@v1.38.0-rc.1/cmd/kube-apiserver/app/config.go", "v1.38.0-rc.1", true}, // -trimpath
		{"/src/kubernetes/cmd/kube-apiserver/app/config.go", "", false},                           // a local replacement
	} {
		got, ok := versionFromSourcePath(tc.file, "k8s.io/kubernetes")
		if got != tc.want || ok != tc.ok {
			t.Errorf("versionFromSourcePath(%q) = %q, %v; want %q, %v", tc.file, got, ok, tc.want, tc.ok)
		}
	}
	// This test binary has no dependency list; the fallback finds the
	// version all the same.
	v, err := KubernetesVersion()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := version.ParseSemantic(v); err != nil || !strings.HasPrefix(v, "v1.") {
		t.Errorf("KubernetesVersion() = %q (%v), want a v1.X.Y version", v, err)
	}
}
