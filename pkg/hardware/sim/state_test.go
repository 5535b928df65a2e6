package sim

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// hardwareWithState makes the hardware of a one-GPU H100 node (MIG mode
// as given) over the state file at path, as a new process would.
func hardwareWithState(t *testing.T, n *Node, path string) (hardware.Hardware, hardware.MIGManager, hardware.MIGModeSwitcher) {
	t.Helper()
	hw := n.Hardware(WithStateFile(path))
	return hw, hw.(hardware.MIGManager), hw.(hardware.MIGModeSwitcher)
}

func discoverOne(t *testing.T, hw hardware.Hardware) hardware.GPU {
	t.Helper()
	inv, err := hw.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) != 1 {
		t.Fatalf("%d GPUs, want 1", len(inv.GPUs))
	}
	return inv.GPUs[0]
}

func TestStateFileOutlivesTheHardware(t *testing.T) {
	ctx := context.Background()
	n := oneGPUNode(t, "H100-SXM5-80GB", true)
	path := filepath.Join(t.TempDir(), "nvml.json")
	hw, mig, _ := hardwareWithState(t, n, path)
	if s, err := ReadState(path); err != nil || s == nil {
		t.Fatalf("no state file after making the hardware: %v, %v", s, err)
	}
	gpu := discoverOne(t, hw)
	p1 := gpu.MIGProfiles[0] // 1g.10gb
	first, err := mig.CreateMIGDevice(ctx, hardware.MIGPlacement{ParentUUID: gpu.UUID, ProfileID: p1.ProfileID, Start: 0})
	if err != nil {
		t.Fatal(err)
	}
	second, err := mig.CreateMIGDevice(ctx, hardware.MIGPlacement{ParentUUID: gpu.UUID, ProfileID: p1.ProfileID, Start: 1})
	if err != nil {
		t.Fatal(err)
	}

	// A new process: the MIG devices are still there, with their UUIDs.
	hw2, mig2, _ := hardwareWithState(t, n, path)
	got := discoverOne(t, hw2).MIGDevices
	if len(got) != 2 || got[0].UUID != first.UUID || got[1].UUID != second.UUID {
		t.Fatalf("after a restart: MIG devices %+v, want %s and %s", got, first.UUID, second.UUID)
	}
	// It destroys one, and creates one whose UUID was never used.
	if err := mig2.DestroyMIGDevice(ctx, hardware.MIGPlacement{ParentUUID: gpu.UUID, ProfileID: p1.ProfileID, Start: 0}); err != nil {
		t.Fatal(err)
	}
	third, err := mig2.CreateMIGDevice(ctx, hardware.MIGPlacement{ParentUUID: gpu.UUID, ProfileID: p1.ProfileID, Start: 2})
	if err != nil {
		t.Fatal(err)
	}
	if third.UUID == first.UUID || third.UUID == second.UUID {
		t.Errorf("new MIG device reuses UUID %s", third.UUID)
	}
	// A placement that another process created is taken for this one too.
	if _, err := mig2.CreateMIGDevice(ctx, hardware.MIGPlacement{ParentUUID: gpu.UUID, ProfileID: p1.ProfileID, Start: 1}); err == nil {
		t.Error("created a MIG device over one that a previous process left")
	}

	s, err := ReadState(path)
	if err != nil {
		t.Fatal(err)
	}
	if uuids := s.GPUs[gpu.UUID].MIGDevices(); len(uuids) != 2 || uuids[0] != second.UUID || uuids[1] != third.UUID {
		t.Errorf("state file MIG devices %v, want [%s %s]", uuids, second.UUID, third.UUID)
	}
}

func TestStateFileKeepsMIGMode(t *testing.T) {
	n := oneGPUNode(t, "H100-SXM5-80GB", false)
	path := filepath.Join(t.TempDir(), "nvml.json")
	_, _, sw := hardwareWithState(t, n, path)
	uuid := n.GPUs[0].UUID
	if err := sw.SetMIGMode(context.Background(), uuid, true); err != nil {
		t.Fatal(err)
	}
	hw2, _, _ := hardwareWithState(t, n, path)
	if gpu := discoverOne(t, hw2); !gpu.MIGEnabled {
		t.Error("MIG mode switched on was forgotten by the next process")
	}
}

func TestStateFileWriteFailureUndoesTheChange(t *testing.T) {
	ctx := context.Background()
	n := oneGPUNode(t, "H100-SXM5-80GB", true)
	dir := t.TempDir()
	path := filepath.Join(dir, "nvml.json")
	hw, mig, _ := hardwareWithState(t, n, path)
	gpu := discoverOne(t, hw)
	p := hardware.MIGPlacement{ParentUUID: gpu.UUID, ProfileID: gpu.MIGProfiles[0].ProfileID, Start: 0}
	// The directory goes away: no change can be written through.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := mig.CreateMIGDevice(ctx, p); err == nil {
		t.Fatal("created a MIG device whose state could not be written")
	}
	if migs := discoverOne(t, hw).MIGDevices; len(migs) != 0 {
		t.Errorf("MIG devices after a failed write: %+v", migs)
	}
}

func TestStateFileThatDoesNotFitBreaksTheHardware(t *testing.T) {
	n := oneGPUNode(t, "H100-SXM5-80GB", true)
	for name, content := range map[string]string{
		"garbage":       "{",
		"version":       `{"version":"v9","gpus":{}}`,
		"other GPUs":    `{"version":"v1","gpus":{"GPU-other":{"minor":0}}}`,
		"wrong profile": `{"version":"v1","gpus":{"` + n.GPUs[0].UUID + `":{"gpuInstances":[{"profile":"9g.1tb","start":0,"id":1}]}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "nvml.json")
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := n.Hardware(WithStateFile(path)).Discover(context.Background())
			if err == nil || !strings.Contains(err.Error(), "state") {
				t.Errorf("Discover over a bad state file: %v, want an error about the state", err)
			}
		})
	}
}

// Two processes drive one node's GPUs at once (a rolling update): each
// sees what the other created and destroyed, as on real hardware.
func TestStateFileSharedByTwoProcesses(t *testing.T) {
	ctx := context.Background()
	n := oneGPUNode(t, "H100-SXM5-80GB", true)
	path := filepath.Join(t.TempDir(), "nvml.json")
	hwA, migA, _ := hardwareWithState(t, n, path)
	hwB, migB, _ := hardwareWithState(t, n, path) // started before A creates anything
	gpu := discoverOne(t, hwA)
	p1 := gpu.MIGProfiles[0] // 1g.10gb
	at := func(start int) hardware.MIGPlacement {
		return hardware.MIGPlacement{ParentUUID: gpu.UUID, ProfileID: p1.ProfileID, Start: start}
	}
	first, err := migA.CreateMIGDevice(ctx, at(0))
	if err != nil {
		t.Fatal(err)
	}
	if got := discoverOne(t, hwB).MIGDevices; len(got) != 1 || got[0].UUID != first.UUID {
		t.Fatalf("B sees MIG devices %+v, want the one A created, %s", got, first.UUID)
	}
	if _, err := migB.CreateMIGDevice(ctx, at(0)); err == nil {
		t.Fatal("B created a MIG device over the one A created")
	}
	second, err := migB.CreateMIGDevice(ctx, at(1))
	if err != nil {
		t.Fatal(err)
	}
	if second.UUID == first.UUID {
		t.Fatalf("B's MIG device reuses A's UUID %s", first.UUID)
	}
	// B destroys A's device; A no longer has it, and can destroy B's.
	if err := migB.DestroyMIGDevice(ctx, at(0)); err != nil {
		t.Fatal(err)
	}
	if got := discoverOne(t, hwA).MIGDevices; len(got) != 1 || got[0].UUID != second.UUID {
		t.Fatalf("A sees MIG devices %+v, want only B's, %s", got, second.UUID)
	}
	if err := migA.DestroyMIGDevice(ctx, at(1)); err != nil {
		t.Fatal(err)
	}
	s, err := ReadState(path)
	if err != nil {
		t.Fatal(err)
	}
	if uuids := s.GPUs[gpu.UUID].MIGDevices(); len(uuids) != 0 {
		t.Errorf("state file still has MIG devices %v", uuids)
	}
	if got := discoverOne(t, hwB).MIGDevices; len(got) != 0 {
		t.Errorf("B still sees MIG devices %+v", got)
	}
}
