package sim

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/nvmlhw"
)

// Hopper switches MIG mode at once, only without GPU instances to turn it
// off; the GPU may come back with another minor, which discovery and the
// MIG capability minors of new devices follow.
func TestSetMIGModeHopper(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, "H100-SXM5-80GB", false, WithMinorAfterMIGModeSwitch(gpuUUID("n0", 0), 5))
	if g := r.discover(t); g.MIGEnabled || g.Minor != 0 {
		t.Fatalf("before: %+v", g)
	}
	if err := r.hw.SetMIGMode(ctx, r.gpu, true); err != nil {
		t.Fatal(err)
	}
	g := r.discover(t)
	if !g.MIGEnabled || g.Minor != 5 || len(g.MIGProfiles) != 7 {
		t.Errorf("after turning MIG on: enabled %v, minor %d, %d profiles; want on, 5, 7", g.MIGEnabled, g.Minor, len(g.MIGProfiles))
	}
	mig, err := r.hw.CreateMIGDevice(ctx, r.at(19, 3))
	if err != nil {
		t.Fatal(err)
	}
	if want, _ := nvmlhw.StandardMIGCapMinors().GI(5, 10); mig.GICapMinor != want {
		t.Errorf("GI cap minor %d, want gpu5/gi10's %d", mig.GICapMinor, want)
	}

	err = r.hw.SetMIGMode(ctx, r.gpu, false)
	if err == nil || !strings.Contains(err.Error(), "1 GPU instance(s) exist (GI 10 (profile 19 at 3)); destroy them first") {
		t.Errorf("turning MIG off with a GPU instance: got %v", err)
	}
	if g := r.discover(t); !g.MIGEnabled || len(g.MIGDevices) != 1 {
		t.Errorf("the refused switch changed the GPU: %+v", g)
	}
	// NVML itself refuses too.
	if _, ret := r.nv.devices[0].SetMigMode(nvml.DEVICE_MIG_DISABLE); ret != nvml.ERROR_IN_USE {
		t.Errorf("nvmlDeviceSetMigMode with a GPU instance: got %v, want ERROR_IN_USE", ret)
	}

	if err := r.hw.DestroyMIGDevice(ctx, r.at(19, 3)); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second time is a no-op
		if err := r.hw.SetMIGMode(ctx, r.gpu, false); err != nil {
			t.Fatal(err)
		}
	}
	if g := r.discover(t); g.MIGEnabled || g.MIGDevices != nil || len(g.MIGProfiles) != 7 {
		t.Errorf("after turning MIG off: %+v", g)
	}
	if got := r.faults.Calls("nvmlDeviceSetMigMode"); got != 3 {
		t.Errorf("nvmlDeviceSetMigMode called %d times, want 3 (on, refused by NVML, off)", got)
	}
}

// An A100 records the new mode as pending until a reset that the
// simulation never does; SetMIGMode says so with an error wrapping
// NVML_ERROR_RESET_REQUIRED.
func TestSetMIGModeAmpere(t *testing.T) {
	ctx := context.Background()
	r := newRig(t, "A100-SXM4-80GB", false, WithMinorAfterMIGModeSwitch(gpuUUID("n0", 0), 5))
	for range 2 {
		err := r.hw.SetMIGMode(ctx, r.gpu, true)
		if !errors.Is(err, nvml.ERROR_RESET_REQUIRED) || !strings.Contains(err.Error(), "pending until the GPU is reset") {
			t.Errorf("got %v, want a pending change needing a reset", err)
		}
	}
	current, pending, _ := r.nv.devices[0].GetMigMode()
	if current != nvml.DEVICE_MIG_DISABLE || pending != nvml.DEVICE_MIG_ENABLE {
		t.Errorf("modes %d/%d, want off now, on pending", current, pending)
	}
	if g := r.discover(t); g.MIGEnabled || g.Minor != 0 {
		t.Errorf("discovered %+v, want MIG off and minor 0", g)
	}
	// Asking for the current mode withdraws the pending change.
	if err := r.hw.SetMIGMode(ctx, r.gpu, false); err != nil {
		t.Fatal(err)
	}
	if current, pending, _ := r.nv.devices[0].GetMigMode(); current != pending {
		t.Errorf("modes %d/%d after withdrawing", current, pending)
	}
}

func TestSetMIGModeErrors(t *testing.T) {
	ctx := context.Background()
	f, err := parseFleet([]byte("nodes:\n- name: n0\n  gpus:\n  - model: L40S\n  - model: H100-SXM5-80GB\n"), "mixed")
	if err != nil {
		t.Fatal(err)
	}
	faults := &Faults{}
	hw := f.Nodes[0].Hardware(WithFaults(faults)).(hardware.MIGModeSwitcher)
	l40s, h100 := f.Nodes[0].GPUs[0].UUID, f.Nodes[0].GPUs[1].UUID
	if err := hw.SetMIGMode(ctx, l40s, true); err == nil || !strings.Contains(err.Error(), "does not support MIG") {
		t.Errorf("L40S: got %v", err)
	}
	if err := hw.SetMIGMode(ctx, "GPU-00000000-0000-4000-8000-000000000000", true); !errors.Is(err, nvml.ERROR_NOT_FOUND) {
		t.Errorf("unknown GPU: got %v", err)
	}
	faults.Fail("nvmlDeviceSetMigMode", 1, nvml.ERROR_NO_PERMISSION)
	if err := hw.SetMIGMode(ctx, h100, true); !errors.Is(err, nvml.ERROR_NO_PERMISSION) || !strings.Contains(err.Error(), "turn MIG mode of GPU "+h100+" on") {
		t.Errorf("no permission: got %v", err)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := hw.SetMIGMode(cancelled, h100, true); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: got %v", err)
	}
}

// The hardware of a node that does not validate fails every MIG operation
// with the reason.
func TestBrokenHardwareMIG(t *testing.T) {
	n := &Node{Name: "bad", GPUs: []GPU{{Model: "V100"}}}
	hw := n.Hardware()
	ctx := context.Background()
	_, createErr := hw.(hardware.MIGManager).CreateMIGDevice(ctx, hardware.MIGPlacement{})
	destroyErr := hw.(hardware.MIGManager).DestroyMIGDevice(ctx, hardware.MIGPlacement{})
	modeErr := hw.(hardware.MIGModeSwitcher).SetMIGMode(ctx, "GPU-x", true)
	for _, err := range []error{createErr, destroyErr, modeErr} {
		if err == nil || !strings.Contains(err.Error(), `unknown model "V100"`) {
			t.Errorf("got %v", err)
		}
	}
}
