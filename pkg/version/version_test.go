package version

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"testing"
)

func TestResolve(t *testing.T) {
	const rev = "0123456789abcdef0123456789abcdef01234567"
	built := func(mainVersion string, settings ...debug.BuildSetting) *debug.BuildInfo {
		return &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: mainVersion}, Settings: settings}
	}
	for _, tc := range []struct {
		name                    string
		version, commit         string
		info                    *debug.BuildInfo
		wantVersion, wantCommit string
	}{
		{"stamped", "v0.1.0", rev, built("(devel)"), "v0.1.0", rev},
		{"stamped wins over build info", "v0.1.0", rev, built("v0.0.9", debug.BuildSetting{Key: "vcs.revision", Value: "feed"}), "v0.1.0", rev},
		{"go install of a tag", "", "", built("v0.1.0"), "v0.1.0", Unknown},
		{"local build with vcs", "", "", built("(devel)", debug.BuildSetting{Key: "vcs.revision", Value: rev}, debug.BuildSetting{Key: "vcs.modified", Value: "false"}), "(devel)", rev},
		{"dirty tree", "", "", built("(devel)", debug.BuildSetting{Key: "vcs.revision", Value: rev}, debug.BuildSetting{Key: "vcs.modified", Value: "true"}), "(devel)", rev + "-dirty"},
		{"version stamped, commit from vcs", "v0.2.0", "", built("(devel)", debug.BuildSetting{Key: "vcs.revision", Value: rev}), "v0.2.0", rev},
		{"no build info", "", "", nil, Unknown, Unknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := resolve(tc.version, tc.commit, tc.info)
			if got.Version != tc.wantVersion || got.Commit != tc.wantCommit {
				t.Errorf("got version %q commit %q, want %q %q", got.Version, got.Commit, tc.wantVersion, tc.wantCommit)
			}
			if want := runtime.GOOS + "/" + runtime.GOARCH; got.Platform != want {
				t.Errorf("platform %q, want %q", got.Platform, want)
			}
			if tc.info != nil && got.GoVersion != tc.info.GoVersion {
				t.Errorf("Go version %q, want the build info's %q", got.GoVersion, tc.info.GoVersion)
			}
		})
	}
}

func TestUserAgentVersion(t *testing.T) {
	for _, tc := range []struct {
		info Info
		want string
	}{
		{Info{Version: "v0.1.0", Commit: "0123456789abcdef0123"}, "v0.1.0+0123456789ab"},
		{Info{Version: "(devel)", Commit: Unknown}, "devel"},
		{Info{Version: "v0.1.0", Commit: "abc"}, "v0.1.0+abc"},
	} {
		if got := tc.info.UserAgentVersion(); got != tc.want {
			t.Errorf("%+v: got %q, want %q", tc.info, got, tc.want)
		}
	}
}

// TestLinkerStamp builds a small program with the -X flags the Makefile
// and the Dockerfile pass, so a renamed variable or package breaks here
// rather than silently in a release.
func TestLinkerStamp(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary")
	}
	bin := filepath.Join(t.TempDir(), "printversion")
	const pkg = "github.com/gpudra/gpudra/pkg/version"
	build := exec.Command("go", "build", "-o", bin,
		"-ldflags", "-X "+pkg+".version=v9.8.7 -X "+pkg+".commit=cafe0123",
		"./testdata/printversion")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	var got Info
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := Info{Version: "v9.8.7", Commit: "cafe0123", GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
}
