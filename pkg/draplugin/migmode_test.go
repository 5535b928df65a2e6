package draplugin_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	ocispec "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpudra/gpudra/internal/shorttemp"
	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// switchFleet has an H100 and an A100, both with MIG mode off.
const switchFleet = `
nodes:
- name: switch-0
  gpus:
  - {model: H100-SXM5-80GB}
  - {model: A100-SXM4-40GB}
`

// newSwitchHarness runs the plugin with MIG mode switching on the
// simulated H100 and A100, with the given hardware options.
func newSwitchHarness(t *testing.T, opts ...func(uuid string) sim.HardwareOption) *harness {
	t.Helper()
	fleet, err := simfleet.Parse([]byte(switchFleet), "test")
	if err != nil {
		t.Fatal(err)
	}
	node, err := fleet.Node("switch-0")
	if err != nil {
		t.Fatal(err)
	}
	h100 := node.GPUs[0].UUID
	var hwOpts []sim.HardwareOption
	for _, o := range opts {
		hwOpts = append(hwOpts, o(h100))
	}
	return newHarnessIn(t, shorttemp.Dir(t), func(cfg *draplugin.Config) {
		cfg.NodeName = "switch-0"
		cfg.Hardware = node.Hardware(hwOpts...)
		cfg.MIGModeSwitching = true
	})
}

func TestMIGModeSwitching(t *testing.T) {
	h := newSwitchHarness(t)
	inv := h.inventory()
	h100, a100 := inv.GPUs[0], inv.GPUs[1]
	// The H100 (Hopper) is offered both ways; the A100 (Ampere would need a
	// GPU reset) only as it is.
	if !h.published(devicemodel.GPUName(h100.Minor)) || !h.published(h.migName(0, "1g.10gb", 6)) {
		t.Fatalf("H100 with MIG mode off not offered both as a full GPU and as MIG devices")
	}
	if !h.published(devicemodel.GPUName(a100.Minor)) || h.published(h.migName(1, "1g.5gb", 6)) {
		t.Errorf("A100 with MIG mode off: want its full GPU only")
	}

	mig := h.claim(h.migName(0, "3g.40gb", 4))
	h.mustPrepare(mig)
	if g := h.inventory().GPUs[0]; !g.MIGEnabled || len(g.MIGDevices) != 1 {
		t.Fatalf("after preparing a MIG device: MIG mode %v with %d MIG devices, want on with 1", g.MIGEnabled, len(g.MIGDevices))
	}
	if msg, err := h.waitForEvent("MIGModeSwitched"); err != nil || !strings.Contains(msg, h100.UUID) {
		t.Errorf("MIGModeSwitched event = %q, %v", msg, err)
	}
	// The full GPU and the MIG device exclude each other.
	full := h.claim(devicemodel.GPUName(h100.Minor))
	if r := h.prepare(full).Claims[string(full.UID)]; r.Error == "" {
		t.Errorf("full GPU prepared while a MIG device of it is")
	}
	h.mustUnprepare(mig)
	if g := h.inventory().GPUs[0]; !g.MIGEnabled || len(g.MIGDevices) != 0 {
		t.Errorf("after unprepare: MIG mode %v with %d MIG devices, want on (kept) with none", g.MIGEnabled, len(g.MIGDevices))
	}

	// Now the full GPU: MIG mode goes off again.
	resp := h.mustPrepare(full)
	if g := h.inventory().GPUs[0]; g.MIGEnabled {
		t.Errorf("MIG mode still on after preparing the full GPU")
	}
	spec := ociEdits(t, h.cfg.CDIDir, resp.Devices[0].CdiDeviceIds)
	if !hasDeviceNode(spec, "/dev/nvidia"+strconv.Itoa(h100.Minor)) {
		t.Errorf("full GPU's CDI edits lack its device node: %+v", deviceNodes(spec))
	}
}

func TestMIGModeSwitchChangesMinor(t *testing.T) {
	h := newSwitchHarness(t, func(uuid string) sim.HardwareOption { return sim.WithMinorAfterMIGModeSwitch(uuid, 9) })
	claim := h.claim(h.migName(0, "1g.10gb", 6))
	resp := h.mustPrepare(claim)
	if g := h.inventory().GPUs[0]; g.Minor != 9 || len(g.MIGDevices) != 1 {
		t.Fatalf("after the switch: minor %d with %d MIG devices, want 9 with 1", g.Minor, len(g.MIGDevices))
	}
	spec := ociEdits(t, h.cfg.CDIDir, resp.Devices[0].CdiDeviceIds)
	if !hasDeviceNode(spec, "/dev/nvidia9") {
		t.Errorf("CDI edits name the GPU's old device node: %+v", deviceNodes(spec))
	}
	// Republished under the new minor.
	waitFor(t, func() bool { return h.published("gpu-9-mig-1g10gb-19-6") && !h.published("gpu-0") })
	h.mustUnprepare(claim)
	if n := len(h.inventory().GPUs[0].MIGDevices); n != 0 {
		t.Errorf("%d MIG devices left after unprepare", n)
	}
}

func TestMIGModeSwitchFailureLeavesAFullGPU(t *testing.T) {
	faults := &sim.Faults{}
	faults.Fail("nvmlDeviceSetMigMode", 1, nvml.ERROR_IN_USE)
	h := newSwitchHarness(t, func(string) sim.HardwareOption { return sim.WithFaults(faults) })
	claim := h.claim(h.migName(0, "1g.10gb", 6))
	r := h.prepare(claim).Claims[string(claim.UID)]
	if r.Error == "" || !strings.Contains(r.Error, "switch MIG mode") {
		t.Fatalf("prepare = %+v, want the failed switch", r)
	}
	if msg, err := h.waitForEvent("MIGModeSwitchFailed"); err != nil || !strings.Contains(msg, "full GPU") {
		t.Errorf("MIGModeSwitchFailed event = %q, %v", msg, err)
	}
	if g := h.inventory().GPUs[0]; g.MIGEnabled || len(g.MIGDevices) != 0 {
		t.Errorf("after the failed switch: MIG mode %v with %d MIG devices, want a full GPU", g.MIGEnabled, len(g.MIGDevices))
	}
	if strings.Contains(h.checkpoint(), string(claim.UID)) || len(h.specFiles()) != 0 {
		t.Errorf("failed claim left a record or spec")
	}
	h.mustPrepare(claim) // the kubelet retries; the fault was one-shot
	if g := h.inventory().GPUs[0]; !g.MIGEnabled || len(g.MIGDevices) != 1 {
		t.Errorf("retry: MIG mode %v with %d MIG devices", g.MIGEnabled, len(g.MIGDevices))
	}
}

func hasDeviceNode(spec *ocispec.Spec, path string) bool {
	return slices.ContainsFunc(deviceNodes(spec), func(n node) bool { return n.path == path })
}
