package containerruntime_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/deployments/container/imagebuild"
)

// TestGpudraImageRuns builds gpudra's image as `make image` does
// (imagebuild.Build over a gpudra binary stamped with a version), imports
// it into a real node's containerd and runs `gpudra version -o json` in a
// container of it through the CRI, as its default user.
func TestGpudraImageRuns(t *testing.T) {
	realNode(t)
	_, ctx := ktesting.NewTestContext(t)
	const (
		version = "v0.0.0-realnode-test"
		commit  = "0123456789abcdef0123456789abcdef01234567"
		ref     = "localhost/gpudra/gpudra:realnode-test"
	)
	dir := t.TempDir()
	bin := filepath.Join(dir, "gpudra")
	// Not make image's -trimpath: it would recompile every package
	// instead of reusing Go's build cache.
	build := exec.CommandContext(ctx, "go", "build", "-o", dir+"/", "-ldflags",
		"-X github.com/gpudra/gpudra/pkg/version.version="+version+" -X github.com/gpudra/gpudra/pkg/version.commit="+commit,
		"./cmd/gpudra", "./cmd/gpudra-node")
	build.Dir = "../../.." // the driver module
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build gpudra: %v\n%s", err, out)
	}
	img, err := imagebuild.Build(imagebuild.Options{
		Binary:      bin,
		NodeBinary:  filepath.Join(dir, "gpudra-node"),
		Executables: imagebuild.DefaultExecutables,
		Libraries:   imagebuild.DefaultLibraries,
		Version:     version,
		Commit:      commit,
		Created:     time.Unix(1700000000, 0).UTC(),
	})
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(dir, "gpudra-image.tar")
	if err := imagebuild.WriteArchive(archive, img, ref); err != nil {
		t.Fatal(err)
	}

	n := startNode(t, ctx, dir, filepath.Join(dir, "cdi"))
	if err := n.rt.Import(ctx, archive); err != nil {
		t.Fatal(err)
	}
	out := n.run(t, ctx, "gpudra-version", &runtimeapi.ContainerConfig{
		Image: &runtimeapi.ImageSpec{Image: ref},
		Args:  []string{"version", "-o", "json"},
	})
	var got struct{ Version, Commit string }
	if err := json.Unmarshal([]byte(strings.Join(out, "\n")), &got); err != nil {
		t.Fatalf("gpudra version -o json in the container: %v\n%s", err, strings.Join(out, "\n"))
	}
	if got.Version != version || got.Commit != commit {
		t.Errorf("gpudra in the container says %s %s, want %s %s", got.Version, got.Commit, version, commit)
	}
}
