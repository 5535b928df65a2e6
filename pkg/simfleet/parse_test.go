package simfleet_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

func TestParseRejects(t *testing.T) {
	// node wraps GPU lines into a one-node fleet.
	node := func(gpus string) string {
		return "nodes:\n- name: n0\n  gpus:\n" + gpus
	}
	tests := []struct {
		name string
		yaml string
		// want are substrings the error must contain: the field's path,
		// and what is allowed where there is a list.
		want []string
	}{
		{"no nodes", "nodes: []", []string{"nodes: a fleet needs at least one node"}},
		{"unknown top-level field", "nodes: []\nclusters: 2", []string{`unknown field "clusters"`}},
		{"unknown GPU field", node("  - model: L40S\n    pciBusId: 0000:01:00.0\n"), []string{`unknown field "nodes[0].gpus[0].pciBusId"`}},
		{"duplicate key", "nodes:\n- name: a\n  name: b\n", []string{`line 3: key "name" already set`}},
		{"empty node name", "nodes:\n- gpus: []", []string{"nodes[0]: name: must not be empty"}},
		{"bad node name", "nodes:\n- name: Node_1", []string{"nodes[0] (Node_1): name:", "not a valid Kubernetes node name"}},
		{"duplicate node", "nodes:\n- name: a\n- name: a", []string{"nodes[1] (a): name:", "nodes[0]"}},
		{"driver version", "nodes:\n- name: a\n  driverVersion: latest", []string{"nodes[0] (a): driverVersion:", `"latest"`}},
		{"CUDA version", "nodes:\n- name: a\n  cudaDriverVersion: \"13\"", []string{"nodes[0] (a): cudaDriverVersion:"}},
		{"sharing", "nodes:\n- name: a\n  sharing: memory", []string{`nodes[0] (a): sharing: sharing "memory": must be none, memory-compute, shares=<N> (N from 1 to 100) or unlimited`}},
		{"too many shares", "nodes:\n- name: a\n  sharing: shares=101", []string{"nodes[0] (a): sharing:", "from 1 to 100"}},
		{"MIG mode", "nodes:\n- name: a\n  migMode: auto", []string{`nodes[0] (a): migMode: "auto": must be dynamic or static`}},
		{"sharing default", "nodes:\n- name: a\n  sharingDefault: half", []string{`nodes[0] (a): sharingDefault: sharing default "half": must be whole or share`}},
		{"mode", "nodes:\n- name: a\n  mode: kubelet", []string{`nodes[0] (a): mode: "kubelet": must be dra or device-plugin`}},
		{"device-plugin config in DRA mode", "nodes:\n- name: a\n  devicePlugin: {version: v1}", []string{"nodes[0] (a): devicePlugin: only for a node with mode: device-plugin"}},
		{"device-plugin config version", "nodes:\n- name: a\n  mode: device-plugin\n  devicePlugin: {version: v2}", []string{`nodes[0] (a): devicePlugin:`, `version "v2": must be v1`}},
		{"settings field misspelt", "nodes:\n- name: a\n  migmode: static", []string{`unknown field "nodes[0].migmode"`}},
		{"settings and hardware both wrong", "nodes:\n- name: a\n  migMode: auto\n  gpus:\n  - model: V100\n",
			[]string{`nodes[0] (a): migMode: "auto"`, `nodes[0] (a): gpus[0].model: unknown model "V100"`}},
		{"unknown model", node("  - model: V100\n"),
			[]string{"nodes[0] (n0): gpus[0].model:", `unknown model "V100"`, "(known models: " + strings.Join(sim.ModelNames(), ", ") + ")"}},
		{"missing model", node("  - minor: 1\n"), []string{"gpus[0].model: must be set"}},
		{"fabric state", "nodes:\n- name: a\n  fabric: {cliqueID: 1, state: Done}", []string{`nodes[0] (a): fabric.state: "Done": must be NotStarted, InProgress or Completed`}},
		{"fabric cluster UUID", "nodes:\n- name: a\n  fabric: {cliqueID: 1, clusterUUID: c1}", []string{`nodes[0] (a): fabric.clusterUUID: "c1" is not a UUID`}},
		{"fabric status before completion", "nodes:\n- name: a\n  fabric: {cliqueID: 1, state: InProgress, status: failed}", []string{"nodes[0] (a): fabric.status: a registration error needs state Completed"}},
		{"fabric field", "nodes:\n- name: a\n  fabric: {cliqueId: 1}", []string{`unknown field "nodes[0].fabric.cliqueId"`}},
		{"minor out of range", node("  - model: L40S\n    minor: 255\n"), []string{"gpus[0].minor: 255 is out of range 0..254"}},
		{"duplicate minor", node("  - model: L40S\n    minor: 1\n  - model: L40S\n"), []string{"gpus[1].minor: 1 is also the minor of gpus[0]"}},
		{"bad UUID", node("  - model: L40S\n    uuid: GPU-1234\n"), []string{"gpus[0].uuid:", `"GPU-1234"`}},
		{"duplicate UUID across nodes",
			"nodes:\n- name: a\n  gpus:\n  - {model: L40S, uuid: GPU-01234567-89ab-4cde-8f01-23456789abcd}\n" +
				"- name: b\n  gpus:\n  - {model: L40S, uuid: GPU-01234567-89ab-4cde-8f01-23456789abcd}\n",
			[]string{"nodes[1] (b) gpus[0].uuid:", "nodes[0] (a) gpus[0]"}},
		{"bad bus ID", node("  - model: L40S\n    pciBusID: 1b:00.0\n"), []string{"gpus[0].pciBusID:", "extended BDF"}},
		{"duplicate bus ID", node("  - model: L40S\n    pciBusID: 0000:21:00.0\n  - model: L40S\n"),
			[]string{"gpus[1].pciBusID: 0000:21:00.0 is also the bus ID of gpus[0]"}},
		{"bad PCIe root", node("  - model: L40S\n    pcieRoot: root0\n"), []string{"gpus[0].pcieRoot:"}},
		{"bad NUMA node", node("  - model: L40S\n    numaNode: -2\n"), []string{"gpus[0].numaNode: -2"}},
		{"topology PCIe root", "nodes:\n- name: a\n  topology: {pcieRoot: none}", []string{`nodes[0] (a): topology.pcieRoot: "none": must be "unknown" or unset`}},
		{"topology NUMA node", "nodes:\n- name: a\n  topology: {numaNode: \"-1\"}", []string{`nodes[0] (a): topology.numaNode: "-1": must be "none" or unset`}},
		{"topology field", "nodes:\n- name: a\n  topology: {pcieRoots: unknown}", []string{`unknown field "nodes[0].topology.pcieRoots"`}},
		{"node NVML function", "nodes:\n- name: a\n  nvmlErrors: {nvmlDeviceGetMemoryInfoV2: NOT_SUPPORTED}",
			[]string{`nodes[0] (a): nvmlErrors: unknown NVML function "nvmlDeviceGetMemoryInfoV2"`, "nvmlDeviceGetBrand, nvmlDeviceGetComputeInstanceId,"}},
		{"library-wide NVML function", "nodes:\n- name: a\n  nvmlErrors: {nvmlInit: UNKNOWN}", []string{`nodes[0] (a): nvmlErrors: unknown NVML function "nvmlInit"`}},
		{"node NVML error", "nodes:\n- name: a\n  nvmlErrors: {nvmlDeviceGetBrand: BROKEN}",
			[]string{`nodes[0] (a): nvmlErrors.nvmlDeviceGetBrand: unknown NVML error "BROKEN"`, "GPU_IS_LOST", "NOT_SUPPORTED", "NO_PERMISSION", "TIMEOUT", "UNKNOWN"}},
		{"GPU NVML error", node("  - model: L40S\n    nvmlErrors: {nvmlDeviceGetMemoryInfo: ERROR_NOT_SUPORTED}\n"),
			[]string{`gpus[0].nvmlErrors.nvmlDeviceGetMemoryInfo: unknown NVML error "ERROR_NOT_SUPORTED"`}},
		{"NIC without model", "nodes:\n- name: a\n  nics:\n  - {pcieRoot: pci0000:15}", []string{"nodes[0] (a): nics[0].model: must be set", "BlueField-3, ConnectX-6, ConnectX-7, ConnectX-8"}},
		{"unknown NIC model", "nodes:\n- name: a\n  nics:\n  - {model: ConnectX-5, pcieRoot: pci0000:15}", []string{`nics[0].model: unknown model "ConnectX-5"`, "BlueField-3, ConnectX-6, ConnectX-7, ConnectX-8"}},
		{"NIC without PCIe root", "nodes:\n- name: a\n  nics:\n  - {model: ConnectX-7}", []string{"nodes[0] (a): nics[0].pcieRoot: must be set"}},
		{"bad NIC PCIe root", "nodes:\n- name: a\n  nics:\n  - {model: ConnectX-7, pcieRoot: root0}", []string{`nics[0].pcieRoot: "root0" is not a PCIe root`}},
		{"NIC link type", "nodes:\n- name: a\n  nics:\n  - {model: ConnectX-7, pcieRoot: pci0000:15, linkType: roce}", []string{`nics[0].linkType: "roce": must be infiniband or ethernet`}},
		{"NIC speed", "nodes:\n- name: a\n  nics:\n  - {model: ConnectX-7, pcieRoot: pci0000:15, speedGbps: -400}", []string{"nics[0].speedGbps: -400: must be a positive speed in Gb/s"}},
		{"NIC field", "nodes:\n- name: a\n  nics:\n  - {model: ConnectX-7, pcieRoot: pci0000:15, speed: 400}", []string{`unknown field "nodes[0].nics[0].speed"`}},
		{"bad NIC bus ID", "nodes:\n- name: a\n  nics:\n  - {model: ConnectX-7, pcieRoot: pci0000:15, pciBusID: \"18:00.0\"}", []string{"nics[0].pciBusID:", "extended BDF"}},
		{"NIC bus ID of a GPU", "nodes:\n- name: a\n  gpus:\n  - {model: L40S}\n  nics:\n  - {model: ConnectX-7, pcieRoot: pci0000:00, pciBusID: \"0000:01:00.0\"}",
			[]string{"nics[0].pciBusID: 0000:01:00.0 is also the bus ID of gpus[0]"}},
		{"duplicate NIC bus ID", "nodes:\n- name: a\n  nics:\n  - {model: ConnectX-7, pcieRoot: pci0000:15, pciBusID: \"0000:18:00.0\"}\n  - {model: ConnectX-7, pcieRoot: pci0000:15, pciBusID: \"0000:18:00.0\"}",
			[]string{"nics[1].pciBusID: 0000:18:00.0 is also the bus ID of nics[0]"}},
		{"bad NIC NUMA node", "nodes:\n- name: a\n  nics:\n  - {model: ConnectX-7, pcieRoot: pci0000:15, numaNode: -3}", []string{"nics[0].numaNode: -3 is not a NUMA node"}},
		{"MIG on a GPU without MIG", node("  - model: L40S\n    migEnabled: true\n"),
			[]string{"gpus[0].migEnabled: model L40S does not support MIG"}},
		{"MIG devices without MIG mode", node("  - model: H100-SXM5-80GB\n    migDevices:\n    - profile: 1g.10gb\n"),
			[]string{"gpus[0].migDevices: MIG devices need migEnabled: true"}},
		{"unknown profile", node("  - model: H100-SXM5-80GB\n    migEnabled: true\n    migDevices:\n    - profile: 1g.5gb\n"),
			[]string{"gpus[0].migDevices[0].profile:", `unknown profile "1g.5gb"`, "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"}},
		{"placement not allowed", node("  - model: H100-SXM5-80GB\n    migEnabled: true\n    migDevices:\n    - {profile: 1g.20gb, placementStart: 3}\n"),
			[]string{"gpus[0].migDevices[0].placementStart: 3 is not allowed for 1g.20gb", "allowed: 0, 2, 4, 6"}},
		{"overlapping placements", node("  - model: H100-SXM5-80GB\n    migEnabled: true\n    migDevices:\n" +
			"    - {profile: 3g.40gb, placementStart: 4}\n    - {profile: 2g.20gb, placementStart: 4}\n"),
			[]string{"gpus[0].migDevices[1].placementStart:", "overlaps migDevices[0] (3g.40gb at 4)"}},
		{"no free placement", node("  - model: A100-SXM4-40GB\n    migEnabled: true\n    migDevices:\n" +
			"    - {profile: 7g.40gb}\n    - {profile: 1g.5gb}\n"),
			[]string{"gpus[0].migDevices[1].placementStart: no free placement left for 1g.5gb"}},
		{"too many instances", node("  - model: H100-SXM5-80GB\n    migEnabled: true\n    migDevices:\n" +
			"    - {profile: 1g.10gb+me}\n    - {profile: 1g.10gb+me}\n"),
			[]string{"gpus[0].migDevices[1].profile: at most 1 1g.10gb+me instance(s)"}},
		{"overlap found by a later device", node("  - model: H100-SXM5-80GB\n    migEnabled: true\n    migDevices:\n" +
			"    - {profile: 4g.40gb, placementStart: 0}\n    - {profile: 2g.20gb, placementStart: 4}\n    - {profile: 1g.20gb, placementStart: 6}\n" +
			"    - {profile: 1g.10gb, placementStart: 6}\n"),
			[]string{"gpus[0].migDevices[3].placementStart: 1g.10gb at 6 (memory slices 6-6) overlaps migDevices[2] (1g.20gb at 6)"}},
		{"MIG engines", node("  - model: A30-24GB\n    migEnabled: true\n    migDevices:\n" +
			"    - {profile: 1g.6gb+me, placementStart: 0}\n    - {profile: 2g.12gb+me, placementStart: 2}\n"),
			[]string{"gpus[0].migDevices[1].profile: 2g.12gb+me does not fit beside the MIG devices before it: a A30-24GB has too few JPEG engines"}},
		{"memory override with MIG", node("  - model: H100-SXM5-80GB\n    memoryMiB: 40000\n    migEnabled: true\n"),
			[]string{"gpus[0].memoryMiB: must be the model's 81559 MiB on a MIG-enabled H100-SXM5-80GB"}},
		{"compute slices too large", node("  - model: H100-SXM5-80GB\n    migEnabled: true\n    migDevices:\n    - {profile: 2g.20gb, computeSlices: 3}\n"),
			[]string{"gpus[0].migDevices[0].computeSlices: 3 is not a compute instance size of 2g.20gb (allowed: 1, 2)"}},
		{"compute slices not a CI profile", node("  - model: H100-SXM5-80GB\n    migEnabled: true\n    migDevices:\n    - {profile: 4g.40gb, computeSlices: 3}\n"),
			[]string{"gpus[0].migDevices[0].computeSlices: 3 is not a compute instance size of 4g.40gb (allowed: 1, 2, 4)"}},
		{"bad MIG UUID", node("  - model: H100-SXM5-80GB\n    migEnabled: true\n    migDevices:\n    - {profile: 7g.80gb, uuid: GPU-01234567-89ab-4cde-8f01-23456789abcd}\n"),
			[]string{"gpus[0].migDevices[0].uuid:", "not a MIG UUID"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := simfleet.Parse([]byte(tt.yaml), "test.yaml")
			if err == nil {
				t.Fatalf("accepted, want an error containing %q", tt.want)
			}
			if !strings.HasPrefix(err.Error(), "fleet test.yaml: ") {
				t.Errorf("error does not name the file: %v", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error does not contain %q:\n%v", w, err)
				}
			}
		})
	}
}

func TestParseReportsEveryProblem(t *testing.T) {
	_, err := simfleet.Parse([]byte("nodes:\n- name: a\n  gpus:\n  - model: X\n  - model: L40S\n    minor: 300\n"), "f")
	if err == nil {
		t.Fatal("accepted")
	}
	for _, w := range []string{"gpus[0].model", "gpus[1].minor"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error does not mention %s: %v", w, err)
		}
	}
}

func TestEveryPlacementAccepted(t *testing.T) {
	for _, name := range sim.ModelNames() {
		m, _ := sim.LookupModel(name)
		for _, p := range m.MIGProfiles {
			for _, start := range p.PlacementStarts {
				y := fmt.Sprintf("nodes:\n- name: a\n  gpus:\n  - model: %s\n    migEnabled: true\n    migDevices:\n"+
					"    - {profile: %s, placementStart: %d}\n", name, p.Name, start)
				if _, err := simfleet.Parse([]byte(y), "f"); err != nil {
					t.Errorf("%s %s at %d: %v", name, p.Name, start, err)
				}
			}
		}
	}
}

func TestParseKeepsSharing(t *testing.T) {
	for _, sharing := range []string{"", "none", "memory-compute", "shares=4", "unlimited"} {
		f, err := simfleet.Parse([]byte("nodes:\n- name: a\n  sharing: \""+sharing+"\"\n"), "f")
		if err != nil {
			t.Fatalf("sharing %q: %v", sharing, err)
		}
		if got := f.Nodes[0].Sharing; got != sharing {
			t.Errorf("sharing %q read as %q", sharing, got)
		}
	}
}

// A node entry's plugin settings and its hardware are one flat mapping in
// the file; each field lands in its own half of the Node.
func TestParseSplitsSettingsFromHardware(t *testing.T) {
	f, err := simfleet.Parse([]byte(`
nodes:
- name: a
  driverVersion: "570.124.06"
  migMode: static
  sharing: shares=4
  sharingDefault: share
  mode: device-plugin
  devicePlugin: {version: v1, flags: {migStrategy: single}}
  gpus:
  - model: L40S
  fabric: {cliqueID: 3}
`), "f")
	if err != nil {
		t.Fatal(err)
	}
	n := f.Nodes[0]
	want := simfleet.PluginSettings{MIGMode: "static", Sharing: "shares=4", SharingDefault: "share", Mode: simfleet.ModeDevicePlugin,
		DevicePlugin: n.DevicePlugin}
	if !reflect.DeepEqual(n.PluginSettings, want) || !strings.Contains(string(n.DevicePlugin), `"migStrategy":"single"`) {
		t.Errorf("settings: got %+v (devicePlugin %s)", n.PluginSettings, n.DevicePlugin)
	}
	if n.Node.Name != "a" || n.DriverVersion != "570.124.06" || len(n.GPUs) != 1 || n.GPUs[0].UUID == "" || n.Fabric == nil || n.Fabric.CliqueID != 3 {
		t.Errorf("hardware: got %+v", n.Node)
	}
	cfg, err := n.DevicePluginConfig()
	if err != nil || cfg == nil || cfg.Flags.MigStrategy == nil || *cfg.Flags.MigStrategy != "single" {
		t.Errorf("DevicePluginConfig: %+v, %v", cfg, err)
	}
	sharing, err := n.GPUSharing()
	if err != nil || sharing.Mode != devicemodel.SharingShares || sharing.Shares != 4 || !sharing.ShareByDefault {
		t.Errorf("GPUSharing: %+v, %v", sharing, err)
	}
}

// NVML error names are taken with or without ERROR_ and in any case, and
// resolved to the name NVML's Return prints; the nearer declaration wins:
// the GPU's over the node's over the model's.
func TestParseResolvesNVMLErrors(t *testing.T) {
	f, err := simfleet.Parse([]byte(`
nodes:
- name: a
  nvmlErrors: {nvmlDeviceGetBrand: not_supported, nvmlDeviceGetArchitecture: ERROR_UNKNOWN}
  gpus:
  - model: GB10
  - model: GB10
    nvmlErrors: {nvmlDeviceGetMemoryInfo: SUCCESS, nvmlDeviceGetArchitecture: TIMEOUT}
  - model: L40S
`), "f")
	if err != nil {
		t.Fatal(err)
	}
	gpus := f.Nodes[0].GPUs
	for i, want := range []map[string]string{
		{"nvmlDeviceGetBrand": "ERROR_NOT_SUPPORTED", "nvmlDeviceGetArchitecture": "ERROR_UNKNOWN", "nvmlDeviceGetMemoryInfo": "ERROR_NOT_SUPPORTED"},
		{"nvmlDeviceGetBrand": "ERROR_NOT_SUPPORTED", "nvmlDeviceGetArchitecture": "ERROR_TIMEOUT", "nvmlDeviceGetMemoryInfo": "SUCCESS"},
		{"nvmlDeviceGetBrand": "ERROR_NOT_SUPPORTED", "nvmlDeviceGetArchitecture": "ERROR_UNKNOWN"},
	} {
		if !reflect.DeepEqual(gpus[i].NVMLErrors, want) {
			t.Errorf("gpus[%d].nvmlErrors: got %v, want %v", i, gpus[i].NVMLErrors, want)
		}
	}
}
