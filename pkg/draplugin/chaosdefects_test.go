package draplugin_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/cdi"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/timeslicing"
	"github.com/gpudra/gpudra/pkg/vfio/fakesysfs"
)

// Regression tests of the defects an independent chaos run found (issue
// "Prove the crash-safety claims at scale"), one per defect where the
// plugin is where it showed.

// damageCheckpoint overwrites the running plugin's checkpoint with garbage.
func damageCheckpoint(t *testing.T, h *harness) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
}

// Defect 1: the Prepare that found a checkpoint damaged while running
// checked conflicts against the empty state, and a GPU in use went to a
// second claim. Now the claims on the node are adopted first.
func TestDamagedCheckpointNeverGivesAHeldGPUAway(t *testing.T) {
	h := newHarness(t)
	first := h.claim("gpu-3")
	h.mustPrepare(first)
	damageCheckpoint(t, h)
	second := h.claim("gpu-3")
	if msg := prepareError(h, second); !strings.Contains(msg, "already prepared for claim") {
		t.Fatalf("second claim for the held GPU: %q, want a conflict", msg)
	}
	if !strings.Contains(h.checkpoint(), string(first.UID)) {
		t.Errorf("first claim not adopted: %s", h.checkpoint())
	}
	// The first claim is still prepared (the kubelet may ask again), and
	// once it is unprepared the GPU is free.
	h.mustPrepare(first)
	h.mustUnprepare(first)
	h.mustPrepare(second)
}

// Defect 1, MIG part: runtime adoption skipped the MIG ownership, so a
// running MIG claim could not be re-prepared and its instance leaked after
// Unprepare. The claim's spec carries its records now.
func TestDamagedCheckpointKeepsMIGOwnership(t *testing.T) {
	h := newMIGHarness(t)
	claim := h.claim(h.migName(0, "1g.10gb", 0))
	h.mustPrepare(claim)
	if n := len(h.migDevices(0)); n != 1 {
		t.Fatalf("%d MIG devices after prepare, want 1", n)
	}
	damageCheckpoint(t, h)
	h.mustPrepare(claim) // the kubelet asks again: adopted, nothing created twice
	if n := len(h.migDevices(0)); n != 1 {
		t.Fatalf("%d MIG devices after re-prepare over the adopted record, want 1", n)
	}
	h.mustUnprepare(claim)
	if migs := h.migDevices(0); len(migs) != 0 {
		t.Errorf("MIG instance leaked after unprepare of the adopted claim: %+v", migs)
	}
}

// Defect 5: one claim holding gpu-N and gpu-vfio-N was prepared, giving
// the container /dev/nvidiaN of a GPU bound to vfio-pci.
func TestClaimWithGPUAndItsVFIODeviceIsRefused(t *testing.T) {
	var fake *fakesysfs.Sysfs
	h := newHarness(t, withVFIO(t, devicemodel.VFIOBeside, &fake))
	claim := h.claim("gpu-2", "gpu-vfio-2")
	msg := prepareError(h, claim)
	if !strings.Contains(msg, "gpu-2") || !strings.Contains(msg, "gpu-vfio-2") || !strings.Contains(msg, "same GPU") {
		t.Fatalf("prepare = %q, want a refusal naming both devices", msg)
	}
	if len(h.specFiles()) != 0 {
		t.Errorf("refused claim left specs: %v", h.specFiles())
	}
}

// Defect 8: during an API partition, Unprepare of a dynamic-MIG claim
// blocked on the claim's status write. It must return without waiting.
func TestUnprepareDoesNotWaitForTheStatusWrite(t *testing.T) {
	release := make(chan struct{})
	blocked := make(chan struct{}, 1)
	// Armed after the Prepare. The reactor is installed before the plugin
	// starts: the fake clientset's reaction chain may not change while the
	// plugin's goroutines use it.
	var armed atomic.Bool
	h := newMIGHarness(t, withReactor("*", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !armed.Load() || a.GetSubresource() != "status" {
			return false, nil, nil
		}
		select {
		case blocked <- struct{}{}:
		default:
		}
		<-release // an API server that does not answer
		return false, nil, nil
	}))
	// Before the harness's stop, which waits for the hanging write.
	t.Cleanup(func() { close(release) })
	claim := h.claim(h.migName(0, "1g.10gb", 0))
	h.mustPrepare(claim)
	armed.Store(true)
	h.mustUnprepare(claim) // returns while the status write hangs
	if migs := h.migDevices(0); len(migs) != 0 {
		t.Errorf("MIG instance not destroyed: %+v", migs)
	}
	select {
	case <-blocked:
	case <-time.After(10 * time.Second):
		t.Error("the status write was never attempted")
	}
}

// Defect 9: a checkpoint of a newer version dropped the node's MIG GPUs
// from the slices with a misleading "gpudra did not create" event.
func TestNewerCheckpointKeepsMIGGPUsPublished(t *testing.T) {
	h := newMIGHarness(t)
	claim := h.claim(h.migName(0, "1g.10gb", 0))
	h.mustPrepare(claim)
	before := len(h.driver.Devices())
	h.stop()
	if err := os.WriteFile(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json"), []byte(`{"version":"v99","bootID":"boot-1"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h.start()
	if got := len(h.driver.Devices()); got != before {
		t.Errorf("%d devices published with a newer checkpoint, want %d as before", got, before)
	}
	if _, err := h.waitForEvent("CheckpointTooNew"); err != nil {
		t.Error(err)
	}
	events, err := h.client.CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if e.Reason == "MIGOwnershipUnknown" {
			t.Errorf("misleading event: %s", e.Message)
		}
	}
	if msg := prepareError(h, h.claim(h.migName(1, "1g.10gb", 0))); !strings.Contains(msg, "newer") {
		t.Errorf("prepare with a newer checkpoint: %q, want it refused as newer", msg)
	}
}

// Restarted plugin: a record of a configurator name this plugin does not
// know is treated like a newer checkpoint, and left alone.
func TestUnknownRecordLeavesCheckpointAlone(t *testing.T) {
	h := newHarness(t)
	h.stop()
	content := `{"version":"v5","bootID":"boot-1","requires":["computeDomainChannel"],"claims":{}}` + "\n"
	path := filepath.Join(h.cfg.PluginDataDir, "checkpoint.json")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	h.start()
	if msg := prepareError(h, h.claim("gpu-0")); !strings.Contains(msg, "computeDomainChannel") {
		t.Errorf("prepare = %q, want the unknown record named", msg)
	}
	if data, _ := os.ReadFile(path); string(data) != content {
		t.Errorf("checkpoint rewritten:\n%s", data)
	}
}

// In static MIG mode the MIG devices are an operator's, named like dynamic
// ones: adoption after a lost checkpoint must never take one for gpudra's,
// or Unprepare would destroy it. In dynamic mode an operator's MIG device
// (a node migrated from another driver) is published as the same static
// device, and the same holds.
func TestStaticMIGInstanceSurvivesAdoption(t *testing.T) {
	for _, mode := range []draplugin.MIGMode{draplugin.MIGModeStatic, draplugin.MIGModeDynamic} {
		t.Run(string(mode), func(t *testing.T) {
			h := newMIGHarness(t, func(cfg *draplugin.Config) { cfg.MIGMode = mode })
			m := h.operatorInstance(0, "1g.10gb", 0)
			h.restart() // publish the operator's instance
			var name string
			for _, d := range h.driver.Devices() {
				if d.Attributes["uuid"].StringValue != nil && *d.Attributes["uuid"].StringValue == m.UUID {
					name = d.Name
				}
			}
			if name == "" {
				t.Fatalf("static MIG device %s not published", m.UUID)
			}
			claim := h.claim(name)
			h.mustPrepare(claim)
			h.stop()
			if err := os.Remove(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json")); err != nil {
				t.Fatal(err)
			}
			h.start()
			h.mustUnprepare(claim)
			if migs := h.migDevices(0); len(migs) != 1 || migs[0].UUID != m.UUID {
				t.Errorf("the operator's MIG device was destroyed by the unprepare of an adopted claim: %+v", migs)
			}
		})
	}
}

// After a lost checkpoint, a VFIO claim adopted from its CDI spec knows its
// passthrough (the spec carries its record): Unprepare gives the GPU back
// to nvidia.
func TestAdoptedVFIOClaimGivesTheGPUBack(t *testing.T) {
	var fake *fakesysfs.Sysfs
	h := newHarness(t, withVFIO(t, devicemodel.VFIOBeside, &fake))
	bdf := *h.device("gpu-vfio-3").Attributes["resource.kubernetes.io/pciBusID"].StringValue
	claim := h.claim("gpu-vfio-3")
	h.mustPrepare(claim)
	if b, _ := fake.Binding(bdf); b.Driver != "vfio-pci" {
		t.Fatalf("GPU %s after prepare: %+v, want vfio-pci", bdf, b)
	}
	h.stop()
	if err := os.Remove(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json")); err != nil {
		t.Fatal(err)
	}
	h.start()
	if !strings.Contains(h.checkpoint(), `"vfio":{"devices":[{"device":"gpu-vfio-3"`) {
		t.Errorf("adopted record lacks the passthrough: %s", h.checkpoint())
	}
	if msg := prepareError(h, h.claim("gpu-3")); !strings.Contains(msg, "already prepared for claim") {
		t.Errorf("full GPU while the adopted claim holds it passed through: %q, want a conflict", msg)
	}
	h.mustUnprepare(claim)
	if b, _ := fake.Binding(bdf); b.Driver != "nvidia" || b.Override != "" {
		t.Errorf("after unprepare of the adopted claim GPU %s: %+v, want nvidia with no override", bdf, b)
	}
}

// After a lost checkpoint, a time-sliced claim adopted from its CDI spec
// keeps its interval: another interval is refused, and its Unprepare puts
// the GPU back to Default.
func TestAdoptedTimeSlicedClaimKeepsItsInterval(t *testing.T) {
	setter := &timeslicing.Memory{}
	h := newHarness(t, withUnlimitedSharing(t), func(c *draplugin.Config) { c.TimeSlicer = setter })
	gpu := h.deviceUUID("gpu-7")
	long := h.shareClaim("gpu-7", "share-a", fmt.Sprintf(timeSlicingConfig, "Long"))
	h.mustPrepare(long)
	h.stop()
	if err := os.Remove(filepath.Join(h.cfg.PluginDataDir, "checkpoint.json")); err != nil {
		t.Fatal(err)
	}
	h.start()
	short := h.shareClaim("gpu-7", "share-b", fmt.Sprintf(timeSlicingConfig, "Short"))
	if msg := prepareError(h, short); !strings.Contains(msg, "sharing.timeSlicingConfig.interval") {
		t.Errorf("another interval beside the adopted hold: %q, want it refused naming the field", msg)
	}
	h.mustUnprepare(long)
	if got, _ := setter.Interval(gpu); got != v1beta1.DefaultTimeSlice {
		t.Errorf("after unprepare of the adopted holder: %q, want Default", got)
	}
	h.mustPrepare(short)
}

// writeInterruptedSpec leaves what a plugin killed between writing a
// claim's CDI spec and recording its completion leaves: the claim's spec
// naming the device, and no record.
func writeInterruptedSpec(t *testing.T, h *harness, uid types.UID, device string) string {
	t.Helper()
	w, err := cdi.NewWriter(h.cfg.CDIDir, driverName)
	if err != nil {
		t.Fatal(err)
	}
	spec := fmt.Sprintf(`{"cdiVersion":"0.6.0","kind":%q,"devices":[{"name":"%s-%s","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia3","type":"c","major":195,"minor":3}]}}],"containerEdits":{}}`,
		cdi.Kind(driverName), uid, device)
	if err := os.WriteFile(w.Path(string(uid)), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	return w.Path(string(uid))
}

// Chaos run (internal/chaos, seed 104 of `make chaos`): a Prepare killed
// after it wrote the claim's CDI spec left the spec behind; the kubelet's
// retry was refused, because the GPU had gone to another claim after a
// forced deletion, and the refused claim kept its spec, so two claims'
// specs named one GPU until the sweep's age limit. A refused Prepare of a
// claim without a record removes what an interrupted attempt left.
func TestRefusedPrepareRemovesAnInterruptedAttemptsSpec(t *testing.T) {
	t.Run("device held by another claim", func(t *testing.T) {
		h := newHarness(t)
		h.mustPrepare(h.claim("gpu-3"))
		late := h.claim("gpu-3")
		path := writeInterruptedSpec(t, h, late.UID, "gpu-3")
		if msg := prepareError(h, late); !strings.Contains(msg, "already prepared for claim") {
			t.Fatalf("prepare = %q, want a conflict", msg)
		}
		if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the refused claim's spec from an interrupted attempt is still there (%v)", err)
		}
	})
	t.Run("time slice refused by its guard", func(t *testing.T) {
		h := newHarness(t, withUnlimitedSharing(t), func(c *draplugin.Config) { c.TimeSlicer = &timeslicing.Memory{} })
		h.mustPrepare(h.shareClaim("gpu-3", "share-a", fmt.Sprintf(timeSlicingConfig, "Long")))
		late := h.shareClaim("gpu-3", "share-b", fmt.Sprintf(timeSlicingConfig, "Short"))
		path := writeInterruptedSpec(t, h, late.UID, "gpu-3-share-b")
		if msg := prepareError(h, late); !strings.Contains(msg, "sharing.timeSlicingConfig.interval") {
			t.Fatalf("prepare = %q, want the interval refused", msg)
		}
		if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the refused claim's spec from an interrupted attempt is still there (%v)", err)
		}
	})
}

// Chaos run against the real API server (`make chaos-real`, seed 67): a
// claim no configurator plans anything for (an uncapped share with no
// config, a whole GPU with none) gets no start record, so the conflict and
// counter checks met it only in the transaction that records its
// completion, after its CDI spec was written. A plugin killed between the
// two left the spec of a claim whose GPU another claim held through its
// VFIO device (handed out again after a forced deletion): two claims'
// specs over one GPU's counters until the next start or the sweep. Such a
// claim is now checked before its spec is written. The fault hook looks at
// the node where a kill before the completion record would leave it.
func TestUnrecordedClaimIsCheckedBeforeItsSpec(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sharing bool
	}{
		{name: "whole GPU", sharing: false},
		{name: "uncapped share", sharing: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var fake *fakesysfs.Sysfs
			var h *harness
			var late types.UID
			mutate := []func(*draplugin.Config){withVFIO(t, devicemodel.VFIOBeside, &fake), func(c *draplugin.Config) {
				c.Faults = func(s draplugin.Step, uid string) error {
					if s == draplugin.StepRecordCompleted && types.UID(uid) == late && len(h.specFiles()) > 1 {
						t.Errorf("a kill before the completion record would leave specs %v: the late claim's names a GPU held through its VFIO device", h.specFiles())
					}
					return nil
				}
			}}
			if tc.sharing {
				mutate = append(mutate, withUnlimitedSharing(t))
			}
			h = newHarness(t, mutate...)
			h.mustPrepare(h.claim("gpu-vfio-2"))
			var claim = h.claim("gpu-2")
			if tc.sharing {
				claim = h.shareClaim("gpu-2", "share-a", "")
			}
			late = claim.UID
			if msg := prepareError(h, claim); !strings.Contains(msg, "already prepared for claim") {
				t.Fatalf("prepare = %q, want a conflict with the VFIO claim", msg)
			}
			if files := h.specFiles(); len(files) != 1 {
				t.Errorf("specs after the refusal: %v, want the VFIO claim's alone", files)
			}
		})
	}
}
