package sim_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// TestFabricFleets discovers the built-in NVLink racks through the real
// NVML discovery code: every GPU in clique 1 of one fabric, with the IMEX
// channels' major, and the model's figures.
func TestFabricFleets(t *testing.T) {
	tests := []struct {
		fleet             string
		nodes             int
		product, arch, cc string
		memoryMiB         uint64
		busIDs            []string // per GPU index
		migProfiles       int
		migNodes          []string // nodes whose GPUs run in MIG mode, with 4 MIG devices each
	}{
		{"gb200-nvl72", 18, "NVIDIA GB200", "Blackwell", "10.0", 189471,
			[]string{"0008:01:00.0", "0009:01:00.0", "0018:01:00.0", "0019:01:00.0"}, 0, nil},
		{"gh200-nvl32", 32, "NVIDIA GH200 480GB", "Hopper", "9.0", 97871,
			[]string{"0009:01:00.0"}, 7, []string{"gh200-nvl32-28", "gh200-nvl32-29", "gh200-nvl32-30", "gh200-nvl32-31"}},
	}
	for _, tt := range tests {
		t.Run(tt.fleet, func(t *testing.T) {
			invs := discover(t, tt.fleet)
			if len(invs) != tt.nodes {
				t.Fatalf("%d nodes, want %d", len(invs), tt.nodes)
			}
			wantClique := sim.DefaultClusterUUID + ".1"
			uuids := map[string]bool{}
			for name, inv := range invs {
				if inv.Problems != nil || len(inv.GPUs) != len(tt.busIDs) {
					t.Fatalf("%s: %d GPUs, problems %+v", name, len(inv.GPUs), inv.Problems)
				}
				if inv.Majors.IMEXChannels != sim.IMEXChannelsMajor {
					t.Errorf("%s: majors %+v", name, inv.Majors)
				}
				for i, g := range inv.GPUs {
					if g.ProductName != tt.product || g.Architecture != tt.arch || g.CUDAComputeCapability != tt.cc ||
						g.MemoryBytes != tt.memoryMiB<<20 || g.MIGCapable != (tt.migProfiles > 0) || len(g.MIGProfiles) != tt.migProfiles {
						t.Errorf("%s GPU %d: %+v", name, i, g)
					}
					if mig := slices.Contains(tt.migNodes, name); g.MIGEnabled != mig || len(g.MIGDevices) != map[bool]int{false: 0, true: 4}[mig] {
						t.Errorf("%s GPU %d: MIG mode %v with %d MIG devices, want %v", name, i, g.MIGEnabled, len(g.MIGDevices), mig)
					}
					if g.PCIBusID != tt.busIDs[i] {
						t.Errorf("%s GPU %d: bus ID %s, want %s", name, i, g.PCIBusID, tt.busIDs[i])
					}
					if !g.Fabric.Attached() || g.Fabric.CliqueID != 1 || g.Fabric.ClusterUUID != sim.DefaultClusterUUID {
						t.Errorf("%s GPU %d: fabric %+v", name, i, g.Fabric)
					}
					uuids[g.UUID] = true
				}
				if clique, err := inv.CliqueID(); err != nil || clique != wantClique {
					t.Errorf("%s: CliqueID() = %q, %v; want %q", name, clique, err, wantClique)
				}
			}
			if want := tt.nodes * len(tt.busIDs); len(uuids) != want {
				t.Errorf("%d distinct GPU UUIDs, want %d", len(uuids), want)
			}
		})
	}
}

// checkGB200Tray checks a built-in fleet's GB200 compute tray: four GB200
// in clique 1 of the default fabric cluster; it adds their UUIDs to uuids.
func checkGB200Tray(t *testing.T, name string, inv *hardware.Inventory, uuids map[string]bool) {
	t.Helper()
	wantClique := sim.DefaultClusterUUID + ".1"
	if inv.Problems != nil || len(inv.GPUs) != 4 {
		t.Fatalf("%s: %d GPUs, problems %+v", name, len(inv.GPUs), inv.Problems)
	}
	if inv.Majors.IMEXChannels != sim.IMEXChannelsMajor {
		t.Errorf("%s: majors %+v", name, inv.Majors)
	}
	for i, g := range inv.GPUs {
		if g.ProductName != "NVIDIA GB200" || g.Architecture != "Blackwell" || g.CUDAComputeCapability != "10.0" ||
			g.MemoryBytes != 189471<<20 || g.MIGCapable {
			t.Errorf("%s GPU %d: %+v", name, i, g)
		}
		if want := []string{"0008:01:00.0", "0009:01:00.0", "0018:01:00.0", "0019:01:00.0"}[i]; g.PCIBusID != want {
			t.Errorf("%s GPU %d: bus ID %s, want %s", name, i, g.PCIBusID, want)
		}
		if !g.Fabric.Attached() || g.Fabric.CliqueID != 1 || g.Fabric.ClusterUUID != sim.DefaultClusterUUID {
			t.Errorf("%s GPU %d: fabric %+v", name, i, g.Fabric)
		}
		uuids[g.UUID] = true
	}
	if clique, err := inv.CliqueID(); err != nil || clique != wantClique {
		t.Errorf("%s: CliqueID() = %q, %v; want %q", name, clique, err, wantClique)
	}
}

// TestFabricStates checks what discovery makes of each fabric a fleet can
// describe, and the node's clique that follows.
func TestFabricStates(t *testing.T) {
	tests := map[string]struct {
		fabric    string
		state     hardware.FabricState
		clique    string
		cliqueErr string
	}{
		"no fabric":   {fabric: "", clique: ""},
		"completed":   {fabric: "fabric: {cliqueID: 7, clusterUUID: 01234567-89ab-4cde-8f01-23456789abcd}", state: hardware.FabricCompleted, clique: "01234567-89ab-4cde-8f01-23456789abcd.7"},
		"in progress": {fabric: "fabric: {cliqueID: 7, state: InProgress}", state: hardware.FabricInProgress, cliqueErr: "registration not finished (state InProgress)"},
		"not started": {fabric: "fabric: {cliqueID: 7, state: NotStarted}", state: hardware.FabricNotStarted, cliqueErr: "registration not finished (state NotStarted)"},
		"failed":      {fabric: "fabric: {cliqueID: 7, status: failed}", state: hardware.FabricCompleted, cliqueErr: "registration failed: ERROR_UNKNOWN"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			f, err := simfleet.Parse([]byte("nodes:\n- name: node-a\n  "+tc.fabric+"\n  gpus:\n  - model: GB200\n  - model: GB200\n"), "test")
			if err != nil {
				t.Fatal(err)
			}
			inv, err := f.Nodes[0].Hardware().Discover(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range inv.GPUs {
				switch {
				case tc.state == "" && g.Fabric != nil:
					t.Errorf("GPU %d: fabric %+v, want none", g.Index, g.Fabric)
				case tc.state != "" && (g.Fabric == nil || g.Fabric.State != tc.state):
					t.Errorf("GPU %d: fabric %+v, want state %s", g.Index, g.Fabric, tc.state)
				}
			}
			clique, err := inv.CliqueID()
			switch {
			case tc.cliqueErr == "" && (err != nil || clique != tc.clique):
				t.Errorf("CliqueID() = %q, %v; want %q", clique, err, tc.clique)
			case tc.cliqueErr != "" && (err == nil || !strings.Contains(err.Error(), tc.cliqueErr)):
				t.Errorf("CliqueID() = %q, %v; want an error containing %q", clique, err, tc.cliqueErr)
			}
		})
	}
}

// TestFabricCompletesAfter: a registration still in progress when the node
// boots (Fabric Manager starting) reports InProgress until completesAfter
// has passed since the hardware was created, then Completed, in the node's
// clique.
func TestFabricCompletesAfter(t *testing.T) {
	f, err := simfleet.Parse([]byte("nodes:\n- name: node-a\n  fabric: {cliqueID: 7, state: InProgress, completesAfter: 300ms}\n  gpus:\n  - model: GB200\n  - model: GB200\n"), "test")
	if err != nil {
		t.Fatal(err)
	}
	hw := f.Nodes[0].Hardware()
	state := func() hardware.FabricState {
		t.Helper()
		inv, err := hw.Discover(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range inv.GPUs[1:] {
			if g.Fabric.State != inv.GPUs[0].Fabric.State {
				t.Errorf("GPU %d in state %s, GPU 0 in %s: one node's GPUs register together", g.Index, g.Fabric.State, inv.GPUs[0].Fabric.State)
			}
		}
		return inv.GPUs[0].Fabric.State
	}
	if s := state(); s != hardware.FabricInProgress {
		t.Fatalf("at boot: state %s, want InProgress", s)
	}
	time.Sleep(400 * time.Millisecond)
	if s := state(); s != hardware.FabricCompleted {
		t.Fatalf("after completesAfter: state %s, want Completed", s)
	}
	if again := f.Nodes[0].Hardware(); again != nil {
		inv, err := again.Discover(context.Background())
		if err != nil || inv.GPUs[0].Fabric.State != hardware.FabricInProgress {
			t.Errorf("a new hardware (a reboot): %v, %+v; want InProgress again", err, inv)
		}
	}

	for fabric, want := range map[string]string{
		"{cliqueID: 7, completesAfter: 20s}":                       "fabric.completesAfter: needs state NotStarted or InProgress",
		"{cliqueID: 7, state: NotStarted, completesAfter: -1s}":    "must be a positive duration",
		"{cliqueID: 7, state: NotStarted, completesAfter: twenty}": `invalid duration "twenty"`,
	} {
		_, err := simfleet.Parse([]byte("nodes:\n- name: node-a\n  fabric: "+fabric+"\n  gpus:\n  - model: GB200\n"), "test")
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("fabric %s: %v, want an error containing %q", fabric, err, want)
		}
	}
}
