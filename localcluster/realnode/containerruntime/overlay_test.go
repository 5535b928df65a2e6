package containerruntime_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/localcluster/realnode/containerruntime"
)

// TestStartOnOverlay starts a runtime whose node directory lies on
// overlayfs (as /tmp does on some machines): its snapshotter keeps its
// layers under /dev/shm instead, a container runs, and Stop removes that
// directory.
func TestStartOnOverlay(t *testing.T) {
	realNode(t)
	_, ctx := ktesting.NewTestContext(t)
	base := t.TempDir()
	merged := filepath.Join(base, "merged")
	for _, d := range []string{"lower", "upper", "work", "merged"} {
		if err := os.Mkdir(filepath.Join(base, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := "lowerdir=" + filepath.Join(base, "lower") + ",upperdir=" + filepath.Join(base, "upper") + ",workdir=" + filepath.Join(base, "work")
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Fatalf("mount overlay: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(merged, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount overlay: %v", err)
		}
	})

	// Registered before startNode, so it runs after Stop.
	var root string
	t.Cleanup(func() {
		if _, err := os.Stat(root); root != "" && !os.IsNotExist(err) {
			t.Errorf("%s after Stop: %v, want it removed", root, err)
		}
	})
	n := startNode(t, ctx, merged, filepath.Join(merged, "cdi"))
	var cfg struct {
		Plugins map[string]struct {
			RootPath string `toml:"root_path"`
		}
	}
	if _, err := toml.DecodeFile(filepath.Join(n.rt.Dir(), "containerd.toml"), &cfg); err != nil {
		t.Fatal(err)
	}
	root = cfg.Plugins["io.containerd.snapshotter.v1.overlayfs"].RootPath
	if !strings.HasPrefix(root, "/dev/shm/gpudra-snapshots-") {
		t.Fatalf("snapshotter root %q, want one under /dev/shm", root)
	}
	out := n.run(t, ctx, "on-overlay", &runtimeapi.ContainerConfig{
		Image:   &runtimeapi.ImageSpec{Image: containerruntime.TestImage},
		Command: []string{"/bin/echo", "ran"},
	})
	if len(out) != 1 || out[0] != "ran" {
		t.Errorf("container printed %q, want ran", out)
	}
}
