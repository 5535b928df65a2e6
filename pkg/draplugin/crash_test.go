package draplugin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	schedulingv1beta1 "k8s.io/api/scheduling/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpudra/gpudra/internal/shorttemp"
	"github.com/gpudra/gpudra/pkg/draplugin"
)

var allSteps = []draplugin.Step{draplugin.StepWriteCDISpec, draplugin.StepRecordCompleted}

// TestPrepareFailureAtEachStepRollsBack injects a failure before each step
// of a preparation: the claim fails cleanly (no spec, no record), a retry
// completes it, and unprepare leaves nothing behind.
func TestPrepareFailureAtEachStepRollsBack(t *testing.T) {
	for _, step := range allSteps {
		t.Run(string(step), func(t *testing.T) {
			var failAt draplugin.Step = step
			h := newHarness(t, func(cfg *draplugin.Config) {
				cfg.Faults = func(s draplugin.Step, _ string) error {
					if s == failAt {
						return errors.New("boom")
					}
					return nil
				}
			})
			claim := h.claim("gpu-0")
			r := h.prepare(claim).Claims[string(claim.UID)]
			if !strings.Contains(r.Error, "injected fault at "+string(step)) {
				t.Fatalf("prepare error %q, want the injected fault", r.Error)
			}
			if files := h.specFiles(); len(files) != 0 {
				t.Errorf("CDI specs left after a failed prepare: %v", files)
			}
			if strings.Contains(h.checkpoint(), string(claim.UID)) {
				t.Errorf("checkpoint records a failed claim:\n%s", h.checkpoint())
			}
			failAt = "" // the kubelet retries
			h.mustPrepare(claim)
			if len(h.specFiles()) != 1 || !strings.Contains(h.checkpoint(), string(claim.UID)) {
				t.Errorf("retry did not complete: specs %v, checkpoint %s", h.specFiles(), h.checkpoint())
			}
			h.mustUnprepare(claim)
			if len(h.specFiles()) != 0 || strings.Contains(h.checkpoint(), string(claim.UID)) {
				t.Errorf("unprepare left specs %v or a record", h.specFiles())
			}
		})
	}
}

// crashEnv tells the re-executed test binary where to run and where to die.
const (
	crashDirEnv  = "GPUDRA_CRASH_DIR"
	crashStepEnv = "GPUDRA_CRASH_STEP"
)

// TestCrashHelperProcess is not a test: it is the plugin process that the
// crash test starts and that kills itself with SIGKILL at the given step.
func TestCrashHelperProcess(t *testing.T) {
	dir, step := os.Getenv(crashDirEnv), os.Getenv(crashStepEnv)
	if dir == "" {
		t.Skip("helper process for TestKilledDuringPrepare")
	}
	h := newHarnessIn(t, dir, func(cfg *draplugin.Config) {
		cfg.Faults = func(s draplugin.Step, _ string) error {
			if string(s) == step {
				_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
				select {} // never returns
			}
			return nil
		}
	})
	h.prepare(h.claim("gpu-0"))
	t.Fatal("the helper process survived its own crash")
}

// TestKilledDuringPrepare kills a real plugin process at each step of a
// preparation, then starts a new plugin on the same directories (as a
// DaemonSet restart would): the retry completes, the unprepare leaves
// neither spec nor record, and an orphaned spec is swept once it is older
// than the kubelet's call timeout.
func TestKilledDuringPrepare(t *testing.T) {
	for _, step := range append(allSteps, "AfterCompletion") {
		t.Run(string(step), func(t *testing.T) {
			dir := shorttemp.Dir(t)
			cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelperProcess$", "-test.v")
			cmd.Env = append(os.Environ(), crashDirEnv+"="+dir, crashStepEnv+"="+string(step))
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if step == "AfterCompletion" {
				// Nothing kills it; it finishes the prepare and reports
				// the test failure, like a plugin that dies right after
				// answering.
				if err == nil {
					t.Fatalf("helper should have failed its own test:\n%s", out)
				}
			} else if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("helper process was not killed at %s: %v\n%s", step, err, out)
			}

			h := newHarnessIn(t, dir)
			claim := h.claim("gpu-0") // the same claim the dead process prepared
			resp := h.mustPrepare(claim)
			if len(resp.Devices) != 1 || len(h.specFiles()) != 1 {
				t.Fatalf("after restart: devices %v, specs %v", resp.Devices, h.specFiles())
			}
			h.mustUnprepare(claim)
			if files := h.specFiles(); len(files) != 0 {
				t.Errorf("specs left: %v", files)
			}
			if strings.Contains(h.checkpoint(), string(claim.UID)) {
				t.Errorf("record left:\n%s", h.checkpoint())
			}
		})
	}
}

// TestOrphanedSpecRemovedAfterCallTimeout: a spec without a record (a crash
// between writing it and recording completion) is kept while a preparation
// could still be in flight, then removed.
func TestOrphanedSpecRemovedAfterCallTimeout(t *testing.T) {
	var mu sync.Mutex
	clock := time.Now
	h := newHarness(t, func(cfg *draplugin.Config) {
		cfg.Clock = func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			return clock()
		}
	})
	orphan := filepath.Join(h.cfg.CDIDir, "k8s.gpu.nvidia.com-claim_dead-beef.json")
	if err := os.WriteFile(orphan, []byte(`{"cdiVersion":"0.5.0","kind":"k8s.gpu.nvidia.com/claim","devices":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(h.cfg.CDIDir, "other-vendor.json")
	if err := os.WriteFile(foreign, []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	h.driver.Sweep(h.ctx)
	if _, err := os.Stat(orphan); err != nil {
		t.Fatalf("young orphan removed too early: %v", err)
	}
	later := time.Now().Add(draplugin.DefaultCallTimeout + time.Second)
	mu.Lock()
	clock = func() time.Time { return later }
	mu.Unlock()
	h.driver.Sweep(h.ctx)
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Errorf("old orphan spec not removed: %v", err)
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Errorf("another vendor's spec was touched: %v", err)
	}
}

// TestSweepReleasesClaimsWhoseObjectsAreGone: a completed claim is released
// only once its ResourceClaim and all its pods are gone from the API.
func TestSweepReleasesClaimsWhoseObjectsAreGone(t *testing.T) {
	h := newHarness(t)
	claim := h.claim("gpu-6")
	h.mustPrepare(claim)
	ctx := context.Background()
	pod := claim.Status.ReservedFor[0]
	h.createPod(pod.Name, pod.UID)

	for _, tc := range []struct {
		name      string
		act       func()
		wantStays bool
	}{
		{"claim and pod exist", func() {}, true},
		{"claim deleted, pod still there", func() {
			_ = h.client.ResourceV1().ResourceClaims("default").Delete(ctx, claim.Name, metav1.DeleteOptions{})
		}, true},
		{"pod replaced by a new one with the same name", func() {
			_ = h.client.CoreV1().Pods("default").Delete(ctx, pod.Name, metav1.DeleteOptions{})
			h.createPod(pod.Name, "a-new-uid")
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.act()
			h.driver.Sweep(h.ctx)
			if !strings.Contains(h.checkpoint(), string(claim.UID)) {
				t.Fatal("released on the first sweep that found it gone; want two")
			}
			h.driver.Sweep(h.ctx)
			stays := strings.Contains(h.checkpoint(), string(claim.UID))
			if stays != tc.wantStays {
				t.Errorf("record kept = %v, want %v", stays, tc.wantStays)
			}
			if specs := len(h.specFiles()); (specs == 1) != tc.wantStays {
				t.Errorf("%d specs, want the spec kept = %v", specs, tc.wantStays)
			}
		})
	}
}

// TestCorruptCheckpointAdoptsPreparedClaims: an unreadable checkpoint is
// moved aside with an event, the plugin keeps serving, and the claims whose
// specs are on the node are adopted: their specs survive restarts and
// sweeps, their devices stay held, and the kubelet's unprepare (or the
// claim's disappearance) releases them.
func TestCorruptCheckpointAdoptsPreparedClaims(t *testing.T) {
	dir := shorttemp.Dir(t)
	var clock atomic.Pointer[time.Time]
	now := time.Now()
	clock.Store(&now)
	withClock := func(cfg *draplugin.Config) { cfg.Clock = func() time.Time { return *clock.Load() } }
	advance := func() {
		later := clock.Load().Add(draplugin.DefaultCallTimeout + time.Minute)
		clock.Store(&later)
	}

	// A plugin prepares two claims, then its checkpoint is damaged.
	h := newHarnessIn(t, dir, withClock)
	running, finished := h.claim("gpu-0"), h.claim("gpu-1")
	h.mustPrepare(running)
	h.mustPrepare(finished)
	h.stop()
	if err := os.WriteFile(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json"), []byte(`{"version":"v2","bootID":"boot-1","claims":{`), 0o600); err != nil {
		t.Fatal(err)
	}
	// The "finished" claim is deleted from the API server meanwhile.
	if err := h.client.ResourceV1().ResourceClaims("default").Delete(context.Background(), finished.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	client := h.client

	h = newHarnessIn(t, dir, withClock, func(cfg *draplugin.Config) { cfg.KubeClient = client })
	matches, _ := filepath.Glob(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json.corrupt-*"))
	if len(matches) != 1 {
		t.Fatalf("corrupt checkpoint not moved aside: %v", matches)
	}
	events, err := h.waitForEvent("CheckpointUnreadable")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(events, matches[0]) {
		t.Errorf("event does not say where the file went: %s", events)
	}
	if !strings.Contains(h.checkpoint(), `"adopted":true`) || len(h.specFiles()) != 2 {
		t.Fatalf("claims not adopted: specs %v, checkpoint %s", h.specFiles(), h.checkpoint())
	}
	// The adopted device is still held.
	thief := h.create(&resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "thief", UID: "thief"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: driverName, Pool: nodeName, Device: "gpu-0"}},
		}}},
	})
	if r := h.prepare(thief).Claims["thief"]; !strings.Contains(r.Error, "already prepared") {
		t.Errorf("a second claim got an adopted device: %q", r.Error)
	}

	// Restarts and sweeps long after keep the running claim's spec; the
	// deleted claim is released on the second sweep that finds it gone.
	advance()
	h.restart()
	h.driver.Sweep(h.ctx)
	h.driver.Sweep(h.ctx)
	if !slices.ContainsFunc(h.specFiles(), func(f string) bool { return strings.Contains(f, string(running.UID)) }) {
		t.Errorf("the running claim's spec was removed: %v", h.specFiles())
	}
	if slices.ContainsFunc(h.specFiles(), func(f string) bool { return strings.Contains(f, string(finished.UID)) }) {
		t.Errorf("the deleted claim's spec was kept: %v", h.specFiles())
	}
	if !strings.Contains(h.checkpoint(), `"name":"`+running.Name+`"`) {
		t.Errorf("the adopted claim was not named from the API server: %s", h.checkpoint())
	}
	// The kubelet's retry prepares over the adopted record; unprepare
	// releases everything.
	h.mustPrepare(running)
	if strings.Contains(h.checkpoint(), `"adopted":true`) {
		t.Errorf("prepare did not replace the adopted record: %s", h.checkpoint())
	}
	h.mustUnprepare(running)
	if len(h.specFiles()) != 0 {
		t.Errorf("specs left: %v", h.specFiles())
	}
}

// TestCheckpointDamagedWhileRunning: corruption found by a running plugin
// leads to adoption before any spec is removed.
func TestCheckpointDamagedWhileRunning(t *testing.T) {
	var clock atomic.Pointer[time.Time]
	now := time.Now()
	clock.Store(&now)
	h := newHarness(t, func(cfg *draplugin.Config) { cfg.Clock = func() time.Time { return *clock.Load() } })
	claim := h.claim("gpu-3")
	h.mustPrepare(claim)
	if err := os.WriteFile(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	later := now.Add(draplugin.DefaultCallTimeout + time.Minute)
	clock.Store(&later)
	h.driver.Sweep(h.ctx) // finds the damage
	h.driver.Sweep(h.ctx) // adopts, then sweeps
	if _, err := h.waitForEvent("CheckpointUnreadable"); err != nil {
		t.Error(err)
	}
	if len(h.specFiles()) != 1 || !strings.Contains(h.checkpoint(), string(claim.UID)) {
		t.Errorf("claim not adopted after runtime damage: specs %v, checkpoint %s", h.specFiles(), h.checkpoint())
	}
}

// TestCheckpointDeletedWhileRunning: a checkpoint deleted under a running
// plugin leaves nothing to move aside; the Node event says it disappeared
// (it once said "moved to : ...") and the claims are adopted.
func TestCheckpointDeletedWhileRunning(t *testing.T) {
	h := newHarness(t)
	claim := h.claim("gpu-3")
	h.mustPrepare(claim)
	if err := os.Remove(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json")); err != nil {
		t.Fatal(err)
	}
	h.driver.Sweep(h.ctx) // finds the loss
	msg, err := h.waitForEvent("CheckpointUnreadable")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(msg, "checkpoint disappeared") || strings.Contains(msg, "moved to") {
		t.Errorf("event %q does not say the checkpoint disappeared", msg)
	}
	h.driver.Sweep(h.ctx) // adopts
	if len(h.specFiles()) != 1 || !strings.Contains(h.checkpoint(), string(claim.UID)) {
		t.Errorf("claim not adopted after the checkpoint disappeared: specs %v, checkpoint %s", h.specFiles(), h.checkpoint())
	}
}

func (h *harness) createPod(name string, uid any) {
	h.tb.Helper()
	pod := podObject(name, fmt.Sprint(uid))
	if _, err := h.client.CoreV1().Pods("default").Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		h.tb.Fatal(err)
	}
}

// waitForEvent waits until an event with the reason was recorded and
// returns the messages of all such events.
func (h *harness) waitForEvent(reason string) (string, error) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		list, err := h.client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return "", err
		}
		var msgs []string
		for _, e := range list.Items {
			if e.Reason == reason {
				msgs = append(msgs, e.Message)
			}
		}
		if len(msgs) > 0 {
			return strings.Join(msgs, "\n"), nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "", fmt.Errorf("no %s event recorded", reason)
}

// startedCheckpoint is a checkpoint, written by an earlier plugin, that
// holds an interrupted preparation of claim-1 on gpu-0 and its spec.
func startedCheckpoint(t *testing.T, dir string, startedAt time.Time) (claimUID string) {
	t.Helper()
	claimUID = "00000000-0000-0000-0000-000000000001" // the harness's first claim
	for _, sub := range []string{"plugin", "cdi"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	checkpoint := fmt.Sprintf(`{"version":"v2","bootID":"boot-1","claims":{%q:{"uid":%q,"namespace":"default","name":"claim-1","phase":"PrepareStarted","startedAt":%q,"devices":[{"requests":["gpu0"],"pool":%q,"name":"gpu-0"}]}}}`,
		claimUID, claimUID, startedAt.UTC().Format(time.RFC3339Nano), nodeName)
	if err := os.WriteFile(filepath.Join(dir, "plugin", "checkpoint.json"), []byte(checkpoint), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(dir, "cdi", "k8s.gpu.nvidia.com-claim_"+claimUID+".json")
	if err := os.WriteFile(spec, []byte(`{"cdiVersion":"0.5.0","kind":"k8s.gpu.nvidia.com/claim","devices":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	return claimUID
}

// TestInterruptedPreparationRolledBack: a PrepareStarted record is rolled
// back by the next Prepare of that claim, or by the sweep once the kubelet
// has given up on the call; a device it reserved is held until then.
func TestInterruptedPreparationRolledBack(t *testing.T) {
	t.Run("by the retry", func(t *testing.T) {
		dir := shorttemp.Dir(t)
		uid := startedCheckpoint(t, dir, time.Now())
		h := newHarnessIn(t, dir)
		// Another claim cannot take the device the interrupted one holds.
		other := h.create(&resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "other", UID: "other-uid"},
			Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: driverName, Pool: nodeName, Device: "gpu-0"}},
			}}},
		})
		if r := h.prepare(other).Claims["other-uid"]; !strings.Contains(r.Error, "already prepared for claim default/claim-1") {
			t.Errorf("other claim for gpu-0: %q", r.Error)
		}
		claim := h.claim("gpu-0")
		if string(claim.UID) != uid {
			t.Fatalf("harness claim UID %s, want %s", claim.UID, uid)
		}
		h.mustPrepare(claim)
		if !strings.Contains(h.checkpoint(), `"phase":"PrepareCompleted"`) {
			t.Errorf("retry did not complete the claim:\n%s", h.checkpoint())
		}
		h.mustUnprepare(claim)
		if len(h.specFiles()) != 0 || strings.Contains(h.checkpoint(), uid) {
			t.Errorf("left behind: specs %v, checkpoint %s", h.specFiles(), h.checkpoint())
		}
	})
	t.Run("by the sweep", func(t *testing.T) {
		dir := shorttemp.Dir(t)
		uid := startedCheckpoint(t, dir, time.Now().Add(-time.Minute))
		h := newHarnessIn(t, dir)
		h.driver.Sweep(h.ctx)
		if strings.Contains(h.checkpoint(), uid) || len(h.specFiles()) != 0 {
			t.Errorf("stale preparation not rolled back: specs %v, checkpoint %s", h.specFiles(), h.checkpoint())
		}
	})
	t.Run("young one kept by the sweep", func(t *testing.T) {
		dir := shorttemp.Dir(t)
		uid := startedCheckpoint(t, dir, time.Now())
		h := newHarnessIn(t, dir)
		h.driver.Sweep(h.ctx)
		if !strings.Contains(h.checkpoint(), uid) || len(h.specFiles()) != 1 {
			t.Errorf("a preparation younger than the call timeout was rolled back: specs %v", h.specFiles())
		}
	})
}

// TestSweepKeepsClaimOfLivePodGroup: a claim reserved for a PodGroup
// (KEP-5729) is in use while the PodGroup exists, even with the claim
// gone from the API server and no pod named in its reservedFor; it is
// released once the PodGroup is gone too.
func TestSweepKeepsClaimOfLivePodGroup(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	claim := h.claim("gpu-5")
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{APIGroup: "scheduling.k8s.io", Resource: "podgroups", Name: "trainers", UID: "pg-uid"}}
	claim, err := h.client.ResourceV1().ResourceClaims("default").UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h.mustPrepare(claim)
	group := &schedulingv1beta1.PodGroup{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "trainers", UID: "pg-uid"}}
	if _, err := h.client.SchedulingV1beta1().PodGroups("default").Create(ctx, group, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.client.ResourceV1().ResourceClaims("default").Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.driver.Sweep(h.ctx)
	h.driver.Sweep(h.ctx)
	if !strings.Contains(h.checkpoint(), string(claim.UID)) || len(h.specFiles()) != 1 {
		t.Fatalf("claim of a live PodGroup released: checkpoint %s, specs %v", h.checkpoint(), h.specFiles())
	}
	if !strings.Contains(h.checkpoint(), `{"apiGroup":"scheduling.k8s.io","resource":"podgroups","name":"trainers","uid":"pg-uid"}`) {
		t.Errorf("checkpoint does not record the PodGroup: %s", h.checkpoint())
	}
	if err := h.client.SchedulingV1beta1().PodGroups("default").Delete(ctx, group.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	h.driver.Sweep(h.ctx)
	h.driver.Sweep(h.ctx)
	if strings.Contains(h.checkpoint(), string(claim.UID)) || len(h.specFiles()) != 0 {
		t.Errorf("claim kept after its PodGroup is gone: checkpoint %s, specs %v", h.checkpoint(), h.specFiles())
	}
}
