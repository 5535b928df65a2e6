package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/internal/shorttemp"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// -o yaml and -o json are refused while a kubelet plugin listens in its
// directory: applying them would duplicate the node's pool. Without a
// plugin, or for the table, inspect works, and the slices carry the label
// that finds them again.
func TestInspectRefusesSlicesWhileThePluginServes(t *testing.T) {
	dir := shorttemp.Dir(t)
	run := func(args ...string) (string, error) {
		cmd := newRootCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"inspect", "--fleet", "dgx-h100", "--node", "dgx-h100-0", "--plugin-data-dir", dir}, args...))
		err := cmd.Execute()
		return out.String(), err
	}

	out, err := run("-o", "yaml")
	if err != nil || !strings.Contains(out, "app.kubernetes.io/managed-by: gpudra-inspect") {
		t.Fatalf("no plugin listening: err %v, output without the managed-by label:\n%.400s", err, out)
	}

	ln, err := net.Listen("unix", filepath.Join(dir, "dra.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	for _, format := range []string{"yaml", "json"} {
		_, err := run("-o", format)
		if err == nil || !strings.Contains(err.Error(), "dra.sock") || !strings.Contains(err.Error(), "second copy of every device") {
			t.Errorf("-o %s with a plugin listening: %v; want it refused, naming the socket", format, err)
		}
	}
	if out, err := run(); err != nil || !strings.Contains(out, "gpu-0") {
		t.Errorf("the table with a plugin listening: %v\n%s", err, out)
	}
}

// The table shows how a shared node shares its GPUs.
func TestInspectTableShowsSharing(t *testing.T) {
	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"inspect", "--fleet", "dgx-h100", "--node", "dgx-h100-0", "--vfio", "off", "--consumable-shares", "4"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	// HEALTH: the simulated GPUs' conditions, read once through NVML.
	for _, want := range []string{"SHARING", "shares=4", "8 GPU(s) shared (shares=4): a claim that asks for no capacity gets the whole GPU", "HEALTH", "  ok  "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table does not show %q:\n%s", want, out.String())
		}
	}
}

// inspect publishes from the ownership the plugin's checkpoint records,
// through the plugin's own publishing function: on a node migrated with
// an operator's MIG layout, under the default dynamic mode, the layout is
// shown as static MIG devices with the placements overlapping it left out
// and the reason given; an instance a prepared claim owns is a placement.
func TestInspectShowsAMigratedMIGLayout(t *testing.T) {
	const fleetYAML = `
nodes:
- name: migrated-0
  gpus:
  - model: H100-SXM5-80GB
    migEnabled: true
    migDevices:
    - {profile: 1g.10gb, placementStart: 0}
    - {profile: 3g.40gb, placementStart: 4}
`
	dir := t.TempDir()
	fleetPath := filepath.Join(dir, "fleet.yaml")
	if err := os.WriteFile(fleetPath, []byte(fleetYAML), 0o600); err != nil {
		t.Fatal(err)
	}
	fleet, err := simfleet.Load(fleetPath)
	if err != nil {
		t.Fatal(err)
	}
	n, err := fleet.Node("migrated-0")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := n.Hardware().Discover(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	bootID, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Skipf("no boot ID to stamp the checkpoint with: %v", err)
	}
	owning := filepath.Join(dir, "plugin")
	if err := os.MkdirAll(owning, 0o750); err != nil {
		t.Fatal(err)
	}
	ckpt := fmt.Sprintf(`{"version":"v5","bootID":%q,"claims":{"uid-1":{"uid":"uid-1","phase":"PrepareCompleted",`+
		`"devices":[{"pool":"migrated-0","name":"gpu-0-mig-1g10gb-19-0"}],"records":{"dynamicMIG":{"devices":[`+
		`{"device":"gpu-0-mig-1g10gb-19-0","parentUUID":%q,"profile":"1g.10gb","profileID":19,"start":0,"size":1}]}}}}}`,
		strings.TrimSpace(string(bootID)), inv.GPUs[0].UUID)
	if err := os.WriteFile(filepath.Join(owning, "checkpoint.json"), []byte(ckpt), 0o600); err != nil {
		t.Fatal(err)
	}
	small, big := inv.GPUs[0].MIGDevices[0], inv.GPUs[0].MIGDevices[1]
	for _, tc := range []struct {
		name          string
		args          []string
		want, notWant []string
	}{
		{
			name: "fresh node",
			want: []string{"gpu-0-mig-1g10gb-19-0 ", small.UUID, "gpu-0-mig-3g40gb-9-4 ", big.UUID, "gpu-0-mig-1g10gb-19-1 ",
				"publish: MIGOwnershipUnknown: 1 GPU(s) hold MIG devices gpudra did not create"},
			notWant: []string{"gpu-0-mig-7g80gb-0-0", "gpu-0-mig-1g10gb-19-5", "1g.10gb@0"},
		},
		{
			name:    "a claim owns the 1g.10gb",
			args:    []string{"--plugin-data-dir", owning},
			want:    []string{"1g.10gb@0", "gpu-0-mig-3g40gb-9-4 ", big.UUID, "MIGOwnershipUnknown"},
			notWant: []string{"gpu-0-mig-7g80gb-0-0"},
		},
		{
			name:    "static mode",
			args:    []string{"--mig-mode", "static"},
			want:    []string{small.UUID, big.UUID},
			notWant: []string{"gpu-0-mig-1g10gb-19-1 ", "MIGOwnershipUnknown"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := newRootCommand()
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetArgs(append([]string{"inspect", "--fleet", fleetPath, "--vfio", "off"}, tc.args...))
			if err := cmd.Execute(); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("table lacks %q:\n%s", w, out.String())
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(out.String(), w) {
					t.Errorf("table shows %q:\n%s", w, out.String())
				}
			}
		})
	}
}
