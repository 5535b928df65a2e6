package e2e

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/version"
)

// requiredVersion returns the version of a module this module's go.mod
// requires, as written there.
func requiredVersion(t *testing.T, module string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	f, err := os.Open(filepath.Join(filepath.Dir(file), "..", "..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(strings.TrimPrefix(strings.TrimSpace(sc.Text()), "require "))
		if len(fields) >= 2 && fields[0] == module {
			return fields[1]
		}
	}
	t.Fatalf("go.mod requires no %s", module)
	return ""
}

// TestServerVersion: the API server reports the Kubernetes version it was
// built from, in a form kubectl parses (`kubectl version` failed on the
// unstamped "v0.0.0-master+$Format:%H$").
func TestServerVersion(t *testing.T) {
	info, err := demo.Client().Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	v, err := version.ParseSemantic(info.GitVersion)
	if err != nil {
		t.Fatalf("gitVersion %q does not parse: %v", info.GitVersion, err)
	}
	want := requiredVersion(t, "k8s.io/kubernetes")
	if info.GitVersion != want {
		t.Errorf("gitVersion %q, want %q (the k8s.io/kubernetes module of go.mod)", info.GitVersion, want)
	}
	if info.Major != "1" || info.Minor != version.Itoa(v.Minor()) || info.Platform == "" {
		t.Errorf("major %q, minor %q, platform %q; want 1, %d and a platform", info.Major, info.Minor, info.Platform, v.Minor())
	}
}
