package draplugin_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpudra/gpudra/internal/shorttemp"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/timeslicing"
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
	var d *draplugin.Driver
	go func() {
		var err error
		d, err = draplugin.Start(t.Context(), cfg)
		started <- err
	}()
	select {
	case <-gate.entered:
	case err := <-started:
		t.Fatalf("start returned before its first discovery: %v", err)
	}
	killed := shorttemp.Dir(t)
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

// Crash campaign, defect 3: after a checkpoint loss, dynamic MIG's
// adoption from the API server's allocations made a claim allocated to a
// running claim's MIG device a second owner of its instance. (a) With the
// holder running, the other claim's Unprepare destroyed the instance in
// use. (b) With the holder force-deleted, the sweep destroyed the
// instance and the other claim's Prepare succeeded anyway, its CDI spec
// naming a MIG device that no longer existed.
func TestMIGInstanceHasOneOwnerAfterCheckpointLoss(t *testing.T) {
	for _, holderDeleted := range []bool{false, true} {
		name := "holder running"
		if holderDeleted {
			name = "holder force-deleted"
		}
		t.Run(name, func(t *testing.T) {
			h := newMIGHarness(t)
			dev := h.migName(0, "1g.10gb", 0)
			holder := h.claim(dev)
			h.mustPrepare(holder)
			instance := h.migDevices(0)[0]
			h.stop()
			if err := os.Remove(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json")); err != nil {
				t.Fatal(err)
			}
			stale := h.claim(dev) // the API server allocated the device again
			h.start()

			if !holderDeleted {
				h.mustPrepare(holder) // the kubelet asks again: still its instance
				if msg := prepareError(h, stale); msg == "" {
					t.Fatalf("claim allocated to a running claim's MIG device was prepared")
				}
				h.mustUnprepare(stale)
				if migs := h.migDevices(0); len(migs) != 1 || migs[0].UUID != instance.UUID {
					t.Fatalf("after unprepare of the other claim: %+v, want the holder's %s untouched", migs, instance.UUID)
				}
				h.mustUnprepare(holder)
				if migs := h.migDevices(0); len(migs) != 0 {
					t.Errorf("holder's instance survived its unprepare: %+v", migs)
				}
				return
			}
			if err := h.client.ResourceV1().ResourceClaims(holder.Namespace).Delete(context.Background(), holder.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				h.driver.Sweep(h.ctx)
			}
			resp := h.mustPrepare(stale)
			migs := h.migDevices(0)
			if len(migs) != 1 {
				t.Fatalf("MIG devices after the other claim's prepare: %+v, want the one created for it", migs)
			}
			spec := h.specContent(stale)
			if !strings.Contains(spec, migs[0].UUID) {
				t.Errorf("prepared claim's CDI spec does not name the MIG device that exists (%s): %s (devices %v)", migs[0].UUID, spec, resp.Devices)
			}
		})
	}
}

// A claim adopted after a checkpoint loss whose MIG instance is gone
// (destroyed while nothing recorded it) is prepared again, not completed
// with a CDI spec that names a device that no longer exists.
func TestAdoptedClaimWhoseInstanceIsGoneIsPreparedAgain(t *testing.T) {
	h := newMIGHarness(t)
	claim := h.claim(h.migName(0, "1g.10gb", 0))
	h.mustPrepare(claim)
	old := h.migDevices(0)[0]
	h.stop()
	if err := os.Remove(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json")); err != nil {
		t.Fatal(err)
	}
	h.start()
	p := hardware.MIGPlacement{ParentUUID: h.inventory().GPUs[0].UUID, ProfileID: old.ProfileID, Start: old.PlacementStart}
	if err := h.cfg.Hardware.(hardware.MIGManager).DestroyMIGDevice(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	h.mustPrepare(claim)
	migs := h.migDevices(0)
	if len(migs) != 1 || migs[0].UUID == old.UUID {
		t.Fatalf("MIG devices after re-prepare: %+v, want a new instance in place of %s", migs, old.UUID)
	}
	if spec := h.specContent(claim); !strings.Contains(spec, migs[0].UUID) || strings.Contains(spec, old.UUID) {
		t.Errorf("CDI spec after re-prepare names %s? %v; the destroyed %s? %v", migs[0].UUID, strings.Contains(spec, migs[0].UUID), old.UUID, strings.Contains(spec, old.UUID))
	}
	h.mustUnprepare(claim)
	if migs := h.migDevices(0); len(migs) != 0 {
		t.Errorf("instance left after unprepare: %+v", migs)
	}
}

// Crash campaign, defect 4: timeslice-released.json.tmp-* left by a kill
// was never removed. Every file gpudra writes atomically is cleaned at
// start.
func TestStartRemovesTempFilesOfKilledWrites(t *testing.T) {
	h := newHarness(t, withUnlimitedSharing(t), func(c *draplugin.Config) { c.TimeSlicer = &timeslicing.Memory{} })
	h.stop()
	var left []string
	for _, name := range []string{"timeslice-released.json.tmp-1", "checkpoint.json.tmp-2", "checkpoint.adopt-pending.tmp-3"} {
		path := filepath.Join(h.cfg.PluginDataDir, name)
		if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
			t.Fatal(err)
		}
		left = append(left, path)
	}
	h.start()
	for _, path := range left {
		if _, err := os.Stat(path); err == nil {
			t.Errorf("%s still there after start", filepath.Base(path))
		}
	}
}
