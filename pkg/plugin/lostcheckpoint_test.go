package plugin_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/plugin"
)

// gatedHardware holds the plugin's first discovery until released: the
// window in which the crash campaign killed the plugin, after it opened
// the checkpoint and before it adopted the claims on the node.
type gatedHardware struct {
	hardware.Hardware
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (g *gatedHardware) Discover(ctx context.Context) (*hardware.Inventory, error) {
	g.once.Do(func() {
		close(g.entered)
		<-g.release
	})
	return g.Hardware.Discover(ctx)
}

// copyTree copies the regular files and links under src to dst: what a
// SIGKILL at this moment would leave on the node's disk.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.Walk(src, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		switch {
		case fi.IsDir():
			return os.MkdirAll(to, 0o755)
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(to, data, fi.Mode().Perm())
		}
		return nil // sockets: a killed process serves none
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Crash campaign, defect 1: with checkpoint.json deleted, a plugin killed
// during its next start (after it opened the checkpoint, before it adopted
// the claims from their CDI specs) left a valid, empty checkpoint; the
// process after it trusted it, removed the running claim's spec and gave
// its GPU to a second claim.
func TestKillDuringStartAfterCheckpointLossKeepsClaims(t *testing.T) {
	h := newHarness(t)
	running := h.claim("gpu-3")
	h.mustPrepare(running)
	h.stop()
	if err := os.Remove(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json")); err != nil {
		t.Fatal(err)
	}

	// The next start, held in its first discovery.
	gate := &gatedHardware{Hardware: h.cfg.Hardware, entered: make(chan struct{}), release: make(chan struct{})}
	cfg := h.cfg
	cfg.Hardware = gate
	started := make(chan error, 1)
	var d *plugin.Driver
	go func() {
		var err error
		d, err = plugin.Start(t.Context(), cfg)
		started <- err
	}()
	select {
	case <-gate.entered:
	case err := <-started:
		t.Fatalf("start returned before its first discovery: %v", err)
	}
	killed := shortTempDir(t)
	copyTree(t, h.dir, killed)
	close(gate.release)
	if err := <-started; err != nil {
		t.Fatalf("held start: %v", err)
	}
	d.Stop()

	// A plugin starting from what the kill left.
	h2 := newHarnessIn(t, killed)
	h2.create(running)
	second := h2.claimFor("second", "00000000-0000-0000-0000-0000000000aa", "gpu-3")
	if msg := prepareError(h2, second); !strings.Contains(msg, "already prepared for claim") {
		t.Fatalf("second claim for the running claim's GPU after a kill during start: %q, want a conflict", msg)
	}
	if !strings.Contains(h2.checkpoint(), string(running.UID)) {
		t.Errorf("running claim not adopted: %s", h2.checkpoint())
	}
	h2.mustPrepare(running) // the kubelet asks again: still prepared
	if len(h2.specFiles()) != 1 {
		t.Errorf("specs after re-prepare: %v, want the running claim's", h2.specFiles())
	}
}

// Crash campaign, defect 2: a dangling symbolic link at checkpoint.json
// started the plugin with no claims and no adoption.
func TestDanglingCheckpointLinkKeepsClaims(t *testing.T) {
	h := newHarness(t)
	running := h.claim("gpu-3")
	h.mustPrepare(running)
	h.stop()
	path := filepath.Join(h.cfg.PluginDataDir, "checkpoint.json")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(h.dir, "nowhere.json"), path); err != nil {
		t.Fatal(err)
	}
	h.start()
	if msg := prepareError(h, h.claim("gpu-3")); !strings.Contains(msg, "already prepared for claim") {
		t.Fatalf("second claim for the running claim's GPU: %q, want a conflict", msg)
	}
	h.mustPrepare(running)
	h.mustUnprepare(running)
	h.mustPrepare(h.claim("gpu-3"))
}
