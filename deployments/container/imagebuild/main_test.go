package imagebuild_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// binaries are the gpudra binaries built by this test process.
var binaries struct {
	sync.Mutex
	dir   string
	built map[string]string
}

// crossCC is the C cross compiler for cgo, by GOARCH: Debian's
// gcc-aarch64-linux-gnu and gcc-x86-64-linux-gnu.
var crossCC = map[string]string{"arm64": "aarch64-linux-gnu-gcc", "amd64": "x86_64-linux-gnu-gcc"}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "imagebuild-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binaries.dir, binaries.built = dir, map[string]string{}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// gpudraBinary returns cmd/gpudra of the driver module built for goarch
// (cross-compiled with cgo for another architecture, as `make image`
// builds it), stamped like a release, with cmd/gpudra-node beside it
// (nodeBinary); each architecture is built once per test process.
// GPUDRA_BINARY (amd64) and GPUDRA_BINARY_ARM64 name binaries built
// already instead, each with its gpudra-node beside it.
func gpudraBinary(t *testing.T, goarch string) string {
	t.Helper()
	env := "GPUDRA_BINARY"
	if goarch != "amd64" {
		env += "_" + strings.ToUpper(goarch)
	}
	if bin := os.Getenv(env); bin != "" {
		t.Logf("using %s=%s; its version must be %s", env, bin, testVersion)
		return bin
	}
	binaries.Lock()
	defer binaries.Unlock()
	if bin, ok := binaries.built[goarch]; ok {
		return bin
	}
	dir := filepath.Join(binaries.dir, "linux-"+goarch)
	bin := filepath.Join(dir, "gpudra")
	start := time.Now()
	// Without -trimpath, unlike `make image`: the amd64 build then reuses
	// what `make test`'s `go vet` of the driver module compiled.
	cmd := exec.Command("go", "build", "-o", dir+"/", "-tags", buildTags,
		"-ldflags", "-X "+versionPkg+".version="+testVersion+" -X "+versionPkg+".commit="+testCommit,
		"./cmd/gpudra", "./cmd/gpudra-node")
	cmd.Dir = "../../.."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "GOOS=linux", "GOARCH="+goarch)
	if os.Getenv("CGO_CFLAGS") == "" {
		// The Makefile's: go-nvml's header marks calls deprecated.
		cmd.Env = append(cmd.Env, "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	}
	if goarch != runtime.GOARCH {
		cmd.Env = append(cmd.Env, "CC="+crossCC[goarch])
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build gpudra for %s: %v\n%s", goarch, err, out)
	}
	t.Logf("built gpudra for %s in %v", goarch, time.Since(start).Round(time.Second))
	binaries.built[goarch] = bin
	return bin
}

// nodeBinary is the gpudra-node beside a gpudra binary of gpudraBinary.
func nodeBinary(gpudra string) string {
	return filepath.Join(filepath.Dir(gpudra), "gpudra-node")
}

// buildTags are the Makefile's GO_TAGS.
const buildTags = "grpcnotrace"

// checkVersionOutput checks `gpudra version -o json`: the stamped version
// and commit, and the platform the binary was built for.
func checkVersionOutput(t *testing.T, out []byte, platform string) {
	t.Helper()
	var got struct{ Version, Commit, GoVersion, Platform string }
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("gpudra version -o json: %v\n%s", err, out)
	}
	if got.Version != testVersion || got.Commit != testCommit {
		t.Errorf("gpudra version says %s %s, want %s %s", got.Version, got.Commit, testVersion, testCommit)
	}
	if got.Platform != platform {
		t.Errorf("gpudra version says platform %q, want %q", got.Platform, platform)
	}
}
