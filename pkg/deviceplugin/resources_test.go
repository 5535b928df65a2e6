package deviceplugin_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/deviceplugin"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// inventory discovers a simulated node (fleet YAML text or built-in name).
func inventory(t testing.TB, fleet, node string) *hardware.Inventory {
	t.Helper()
	f, err := simfleet.Load(fleet)
	if err != nil {
		f, err = simfleet.Parse([]byte(fleet), "test")
	}
	if err != nil {
		t.Fatal(err)
	}
	n, err := f.Node(node)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := n.Hardware().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// summary renders resources as "name: n devices (first ID)" lines.
func summary(rs []deviceplugin.Resource) string {
	var lines []string
	for _, r := range rs {
		lines = append(lines, fmt.Sprintf("%s: %d", r.Name, len(r.Devices)))
	}
	return strings.Join(lines, "; ")
}

// singleProfileFleet has every GPU in MIG mode with 1g.10gb devices only.
const singleProfileFleet = `
nodes:
- name: single
  gpus:
  - model: H100-SXM5-80GB
    migEnabled: true
    migDevices: [{profile: 1g.10gb, placementStart: 0}, {profile: 1g.10gb, placementStart: 1}]
  - model: H100-SXM5-80GB
    migEnabled: true
    migDevices: [{profile: 1g.10gb, placementStart: 0}]
`

// withUnreadMIG is singleProfileFleet with the second GPU's MIG mode or
// MIG devices unread, as discovery reports them: no MIG devices, and with
// the mode unread, not MIG-capable.
func withUnreadMIG(t testing.TB, p hardware.Property) *hardware.Inventory {
	t.Helper()
	inv := inventory(t, singleProfileFleet, "single")
	g := &inv.GPUs[1]
	g.MIGDevices, g.MIGProfiles, g.MIGMemorySlices = nil, nil, 0
	if p == hardware.PropertyMIGMode {
		g.MIGCapable, g.MIGEnabled = false, false
	}
	query := map[hardware.Property]string{hardware.PropertyMIGMode: "nvmlDeviceGetMigMode", hardware.PropertyMIGDevices: "nvmlDeviceGetMaxMigDeviceCount"}[p]
	g.Unread = []hardware.Unread{{Property: p, Query: query, Err: "ERROR_UNKNOWN"}}
	return inv
}

func TestPlanStrategies(t *testing.T) {
	a100mig := inventory(t, "dgx-a100-mig", "dgx-a100-0")
	for _, tc := range []struct {
		name    string
		inv     *hardware.Inventory
		opts    deviceplugin.PlanOptions
		want    string
		wantErr string
	}{
		{name: "none on a DGX H100", inv: inventory(t, "dgx-h100", "dgx-h100-0"), want: "nvidia.com/gpu: 8"},
		{name: "none with MIG GPUs advertises them whole", inv: a100mig, want: "nvidia.com/gpu: 8"},
		{name: "mixed", inv: a100mig, opts: deviceplugin.PlanOptions{MIGStrategy: deviceplugin.MIGStrategyMixed},
			want: "nvidia.com/gpu: 4; nvidia.com/mig-1g.5gb: 9; nvidia.com/mig-2g.10gb: 1; nvidia.com/mig-3g.20gb: 2; nvidia.com/mig-4g.20gb: 1; nvidia.com/mig-7g.40gb: 1"},
		{name: "single without MIG GPUs is none", inv: inventory(t, "dgx-h100", "dgx-h100-0"), opts: deviceplugin.PlanOptions{MIGStrategy: deviceplugin.MIGStrategySingle}, want: "nvidia.com/gpu: 8"},
		{name: "single with one profile", inv: inventory(t, singleProfileFleet, "single"), opts: deviceplugin.PlanOptions{MIGStrategy: deviceplugin.MIGStrategySingle}, want: "nvidia.com/gpu: 3"},
		{name: "single with MIG and whole GPUs", inv: a100mig, opts: deviceplugin.PlanOptions{MIGStrategy: deviceplugin.MIGStrategySingle},
			wantErr: "flags.migStrategy single: GPUs [0 1 2 3] are in MIG mode and GPUs [4 5 6 7] are not"},
		{name: "single with a GPU whose MIG devices are unread", inv: withUnreadMIG(t, hardware.PropertyMIGDevices),
			opts: deviceplugin.PlanOptions{MIGStrategy: deviceplugin.MIGStrategySingle}, want: "nvidia.com/gpu: 2"},
		{name: "single with a GPU whose MIG mode is unread", inv: withUnreadMIG(t, hardware.PropertyMIGMode),
			opts: deviceplugin.PlanOptions{MIGStrategy: deviceplugin.MIGStrategySingle}, want: "nvidia.com/gpu: 2"},
		{name: "unknown strategy", inv: a100mig, opts: deviceplugin.PlanOptions{MIGStrategy: "some"}, wantErr: `flags.migStrategy "some": must be one of none, single, mixed`},
		{name: "time slicing", inv: inventory(t, "dgx-h100", "dgx-h100-0"),
			opts: deviceplugin.PlanOptions{TimeSlicing: deviceplugin.ReplicatedResources{Resources: []deviceplugin.ReplicaResource{{Name: deviceplugin.ResourceGPU, Replicas: 4}}}},
			want: "nvidia.com/gpu: 32"},
		{name: "time slicing renamed by default", inv: inventory(t, "dgx-h100", "dgx-h100-0"),
			opts: deviceplugin.PlanOptions{TimeSlicing: deviceplugin.ReplicatedResources{RenameByDefault: true, Resources: []deviceplugin.ReplicaResource{{Name: deviceplugin.ResourceGPU, Replicas: 2}}}},
			want: "nvidia.com/gpu.shared: 16"},
		{name: "time slicing of two GPUs, renamed", inv: inventory(t, "dgx-h100", "dgx-h100-0"),
			opts: deviceplugin.PlanOptions{TimeSlicing: deviceplugin.ReplicatedResources{Resources: []deviceplugin.ReplicaResource{{Name: deviceplugin.ResourceGPU, Rename: "nvidia.com/gpu-shared", Replicas: 3, Devices: deviceplugin.ReplicaDevices{List: []string{"0", "7"}}}}}},
			want: "nvidia.com/gpu: 6; nvidia.com/gpu-shared: 6"},
		{name: "time slicing of a MIG profile", inv: a100mig,
			opts: deviceplugin.PlanOptions{MIGStrategy: deviceplugin.MIGStrategyMixed, TimeSlicing: deviceplugin.ReplicatedResources{Resources: []deviceplugin.ReplicaResource{{Name: deviceplugin.MIGResource("1g.5gb"), Replicas: 2}}}},
			want: "nvidia.com/gpu: 4; nvidia.com/mig-1g.5gb: 18; nvidia.com/mig-2g.10gb: 1; nvidia.com/mig-3g.20gb: 2; nvidia.com/mig-4g.20gb: 1; nvidia.com/mig-7g.40gb: 1"},
		{name: "a resource the node lacks is skipped", inv: inventory(t, "dgx-h100", "dgx-h100-0"),
			opts: deviceplugin.PlanOptions{TimeSlicing: deviceplugin.ReplicatedResources{Resources: []deviceplugin.ReplicaResource{{Name: deviceplugin.MIGResource("1g.10gb"), Replicas: 2}}}},
			want: "nvidia.com/gpu: 8"},
		{name: "a GPU index the node lacks", inv: inventory(t, "dgx-h100", "dgx-h100-0"),
			opts:    deviceplugin.PlanOptions{TimeSlicing: deviceplugin.ReplicatedResources{Resources: []deviceplugin.ReplicaResource{{Name: deviceplugin.ResourceGPU, Rename: "nvidia.com/gpu-shared", Replicas: 2, Devices: deviceplugin.ReplicaDevices{List: []string{"9"}}}}}},
			wantErr: `sharing.timeSlicing.resources[0].devices: "9" names no device of this node's 8 (GPUs 0=GPU-`},
		{name: "a count beyond the node", inv: inventory(t, "dgx-h100", "dgx-h100-0"),
			opts:    deviceplugin.PlanOptions{TimeSlicing: deviceplugin.ReplicatedResources{Resources: []deviceplugin.ReplicaResource{{Name: deviceplugin.ResourceGPU, Rename: "nvidia.com/gpu-shared", Replicas: 2, Devices: deviceplugin.ReplicaDevices{Count: 9}}}}},
			wantErr: "sharing.timeSlicing.resources[0].devices 9: the node has 8 such devices"},
		{name: "some replicated under the same name", inv: inventory(t, "dgx-h100", "dgx-h100-0"),
			opts:    deviceplugin.PlanOptions{TimeSlicing: deviceplugin.ReplicatedResources{Resources: []deviceplugin.ReplicaResource{{Name: deviceplugin.ResourceGPU, Replicas: 2, Devices: deviceplugin.ReplicaDevices{Count: 2}}}}},
			wantErr: "set rename (or renameByDefault)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := deviceplugin.Plan(tc.inv, tc.opts)
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v (%s), want an error with %q", err, summary(rs), tc.wantErr)
				}
			case err != nil:
				t.Fatal(err)
			case summary(rs) != tc.want:
				t.Errorf("got %s, want %s", summary(rs), tc.want)
			}
		})
	}
}

func TestPlanIDs(t *testing.T) {
	inv := inventory(t, "dgx-a100-mig", "dgx-a100-0")
	rs, err := deviceplugin.Plan(inv, deviceplugin.PlanOptions{MIGStrategy: deviceplugin.MIGStrategyMixed, DeviceIDStrategy: deviceplugin.DeviceIDIndex,
		TimeSlicing: deviceplugin.ReplicatedResources{Resources: []deviceplugin.ReplicaResource{{Name: deviceplugin.MIGResource("4g.20gb"), Replicas: 2}}}})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string][]string{}
	for _, r := range rs {
		for _, d := range r.Devices {
			ids[r.Name] = append(ids[r.Name], d.ID)
		}
	}
	if got := strings.Join(ids[deviceplugin.ResourceGPU], ","); got != "4,5,6,7" {
		t.Errorf("full GPUs by index: %s", got)
	}
	if got := strings.Join(ids[deviceplugin.MIGResource("4g.20gb")], ","); got != "2:1::0,2:1::1" {
		t.Errorf("replicated MIG device by index: %s", got)
	}
	rs, err = deviceplugin.Plan(inv, deviceplugin.PlanOptions{MIGStrategy: deviceplugin.MIGStrategyMixed})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		for _, d := range r.Devices {
			if d.ID != d.UUID() || len(d.ID) > 63 {
				t.Errorf("%s: ID %q, want its UUID %q (at most 63 characters)", r.Name, d.ID, d.UUID())
			}
		}
	}
}

func TestParseConfig(t *testing.T) {
	good := `
version: v1
flags:
  migStrategy: mixed
  plugin:
    deviceListStrategy: [envvar, cdi-cri]
    deviceIDStrategy: index
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 4
    - name: nvidia.com/mig-1g.10gb
      devices: [0, "1:0", GPU-9f254704-323e-54e8-af53-3241ba4bef7d]
      replicas: 2
`
	cfg, err := deviceplugin.ParseConfig([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	ts := cfg.Sharing.TimeSlicing
	if *cfg.Flags.MigStrategy != "mixed" || !ts.RenameByDefault || !ts.FailRequestsGreaterThanOne || len(ts.Resources) != 2 ||
		ts.Resources[0].Replicas != 4 || ts.Resources[0].Devices.List != nil ||
		strings.Join(ts.Resources[1].Devices.List, ",") != "0,1:0,GPU-9f254704-323e-54e8-af53-3241ba4bef7d" {
		t.Errorf("parsed %+v", cfg)
	}
	for _, tc := range []struct{ name, in, want string }{
		{"unknown strategy", "version: v1\nflags: {migStrategy: some}", `flags.migStrategy "some": must be one of none, single, mixed`},
		{"zero replicas", "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 0}]}}", "sharing.timeSlicing.resources[0].replicas 0: must be at least 1"},
		{"replicas missing", "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu}]}}", "sharing.timeSlicing.resources[0].replicas 0: must be at least 1"},
		{"replicas a string", "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: four}]}}", "sharing.timeSlicing.resources.replicas: got a JSON string, want int"},
		{"misspelt field", "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replica: 2}]}}", `unknown field "replica"`},
		{"bad resource name", "version: v1\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: 2}]}}", `sharing.timeSlicing.resources[0].name "gpu": must be nvidia.com/gpu or nvidia.com/mig-<profile>`},
		{"bad device", "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: [gpu0]}]}}", `"gpu0" is no GPU index`},
		{"bad devices word", "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: some}]}}", `"some": must be "all"`},
		{"MPS of MIG devices", "version: v1\nsharing: {mps: {resources: [{name: nvidia.com/mig-1g.10gb, replicas: 2}]}}", `sharing.mps.resources[0].name "nvidia.com/mig-1g.10gb": MPS replicas are served for full GPUs only`},
		{"MPS zero replicas", "version: v1\nsharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 0}]}}", "sharing.mps.resources[0].replicas 0: must be at least 1"},
		{"both strategies", "version: v1\nsharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}, timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}", "sharing: timeSlicing and mps both replicate resources"},
		{"wrong version", "version: v2", `version "v2": must be v1`},
		{"empty", "", "empty config"},
		{"list strategy", "version: v1\nflags: {plugin: {deviceListStrategy: [volume-mounts]}}", `flags.plugin.deviceListStrategy[0] "volume-mounts": must be one of envvar, cdi-cri, cdi-annotations`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := deviceplugin.ParseConfig([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestPreferred compares the picks on a DGX H100 with what NVIDIA's
// allocator picks there: all GPUs share NVSwitch NVLink, so the pairs
// under one PCIe switch come first, then one NUMA node.
func TestPreferred(t *testing.T) {
	rs, err := deviceplugin.Plan(inventory(t, "dgx-h100", "dgx-h100-0"), deviceplugin.PlanOptions{DeviceIDStrategy: deviceplugin.DeviceIDIndex})
	if err != nil {
		t.Fatal(err)
	}
	r := &rs[0]
	all := []string{"0", "1", "2", "3", "4", "5", "6", "7"}
	for _, tc := range []struct {
		avail, must []string
		size        int
		want        string
	}{
		{all, nil, 2, "0,1"},
		{all, nil, 4, "0,1,2,3"},
		{all, nil, 8, "0,1,2,3,4,5,6,7"},
		{[]string{"0", "2", "4", "5"}, nil, 2, "4,5"},
		{all, []string{"6"}, 2, "6,7"},
		{[]string{"1", "2", "3", "4", "6"}, []string{"1"}, 3, "1,2,3"},
		{[]string{"0", "4"}, nil, 2, "0,4"},
	} {
		got, err := r.Preferred(tc.avail, tc.must, tc.size)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(got, ",") != tc.want {
			t.Errorf("%d of %v (must %v): got %v, want %s", tc.size, tc.avail, tc.must, got, tc.want)
		}
	}
	if _, err := r.Preferred([]string{"0"}, nil, 2); err == nil {
		t.Error("2 of 1 available: no error")
	}
	if _, err := r.Preferred([]string{"0", "x"}, nil, 1); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Errorf("unknown device: %v", err)
	}

	// Replicas spread: four time slices land on four GPUs.
	rs, err = deviceplugin.Plan(inventory(t, "dgx-h100", "dgx-h100-0"), deviceplugin.PlanOptions{DeviceIDStrategy: deviceplugin.DeviceIDIndex,
		TimeSlicing: deviceplugin.ReplicatedResources{Resources: []deviceplugin.ReplicaResource{{Name: deviceplugin.ResourceGPU, Replicas: 2}}}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range rs[0].Devices {
		ids = append(ids, d.ID)
	}
	got, err := rs[0].Preferred(ids, nil, 4)
	if err != nil {
		t.Fatal(err)
	}
	gpus := map[string]bool{}
	for _, id := range got {
		gpus[strings.Split(id, "::")[0]] = true
	}
	if len(gpus) != 4 {
		t.Errorf("4 replicas from %v, want 4 GPUs", got)
	}
}
