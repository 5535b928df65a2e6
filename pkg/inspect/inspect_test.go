package inspect

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

func fleetNodes(t *testing.T, fleetName string) []Node {
	t.Helper()
	fleet, err := simfleet.Load(fleetName)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []Node
	for _, name := range fleet.NodeNames() {
		n, err := fleet.Node(name)
		if err != nil {
			t.Fatal(err)
		}
		inv, err := n.Hardware().Discover(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		m, err := devicemodel.Build(inv)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, Node{Name: name, Inventory: inv, Model: m})
	}
	return nodes
}

func TestYAMLIsOnlyResourceSlices(t *testing.T) {
	nodes := fleetNodes(t, "demo")
	var out bytes.Buffer
	if err := Write(&out, "yaml", "gpu.nvidia.com", nodes); err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(strings.TrimPrefix(out.String(), "---\n"), "---\n")
	if len(docs) != len(nodes) {
		t.Fatalf("got %d YAML documents, want one slice per node (%d)", len(docs), len(nodes))
	}
	total := 0
	for i, doc := range docs {
		var s resourceapi.ResourceSlice
		if err := yaml.UnmarshalStrict([]byte(doc), &s); err != nil {
			t.Fatalf("document %d is not a ResourceSlice: %v\n%s", i, err, doc)
		}
		if s.Kind != "ResourceSlice" || s.APIVersion != "resource.k8s.io/v1" || s.Spec.Driver != "gpu.nvidia.com" {
			t.Errorf("document %d: %s %s driver %q", i, s.APIVersion, s.Kind, s.Spec.Driver)
		}
		if s.Spec.NodeName == nil || *s.Spec.NodeName != nodes[i].Name || s.Spec.Pool.Name != nodes[i].Name || s.Spec.Pool.ResourceSliceCount != 1 {
			t.Errorf("document %d: node %v pool %+v", i, s.Spec.NodeName, s.Spec.Pool)
		}
		total += len(s.Spec.Devices)
	}
	want := 0
	for _, n := range nodes {
		want += len(n.Model.Devices)
	}
	if total != want {
		t.Errorf("slices hold %d devices, nodes have %d", total, want)
	}
}

func TestJSONIsAListOfSlices(t *testing.T) {
	var out bytes.Buffer
	if err := Write(&out, "json", "gpu.nvidia.com", fleetNodes(t, "dgx-h100")); err != nil {
		t.Fatal(err)
	}
	var list struct {
		Kind  string                      `json:"kind"`
		Items []resourceapi.ResourceSlice `json:"items"`
	}
	if err := json.Unmarshal(out.Bytes(), &list); err != nil {
		t.Fatal(err)
	}
	if list.Kind != "List" || len(list.Items) != 1 || len(list.Items[0].Spec.Devices) != 8 {
		t.Errorf("got kind %q with %d items", list.Kind, len(list.Items))
	}
}

func TestTable(t *testing.T) {
	var out bytes.Buffer
	if err := Write(&out, "table", "gpu.nvidia.com", fleetNodes(t, "dgx-h100")); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"gpu-0", "gpu-7", "NVIDIA H100 80GB HBM3", "81559Mi", "0000:1b:00.0", "8 GPUs, 8 devices, driver 580.65.06"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	if err := Write(&out, "xml", "gpu.nvidia.com", nil); err == nil || !strings.Contains(err.Error(), "table, yaml, json") {
		t.Errorf("unknown format: %v", err)
	}
}

// The table shows each device's taints.
func TestTableShowsTaints(t *testing.T) {
	nodes := fleetNodes(t, "dgx-h100")
	n := &nodes[0]
	sick := n.Inventory.GPUs[3].UUID
	m, err := devicemodel.Build(n.Inventory, devicemodel.WithTaints(func(uuid string) []resourceapi.DeviceTaint {
		if uuid != sick {
			return nil
		}
		return []resourceapi.DeviceTaint{
			{Key: "gpu.nvidia.com/gpu-lost", Effect: resourceapi.DeviceTaintEffectNoExecute},
			{Key: "gpu.nvidia.com/xid", Value: "79", Effect: resourceapi.DeviceTaintEffectNoSchedule},
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	n.Model = m
	var out bytes.Buffer
	if err := WriteTable(&out, nodes[:1]); err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out.String(), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		const want = "gpu.nvidia.com/gpu-lost:NoExecute,gpu.nvidia.com/xid=79:NoSchedule"
		switch fields[1] {
		case "DEVICE":
			if !strings.Contains(line, "TAINTS") {
				t.Errorf("header lacks TAINTS: %s", line)
			}
		case "gpu-3":
			if !strings.Contains(line, want) {
				t.Errorf("gpu-3 line lacks %s: %s", want, line)
			}
		default:
			if strings.Contains(line, "gpu.nvidia.com/") {
				t.Errorf("untainted device shows taints: %s", line)
			}
		}
	}
}

// TestTableShowsHealth checks the HEALTH column and the notes under a
// node's summary, with the GPUs' conditions read by the real NVML code
// over the simulated node: a GPU after an XID needs a reset, a lost GPU is
// left out of discovery but still has a line.
func TestTableShowsHealth(t *testing.T) {
	fleet, err := simfleet.Load("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	n := fleet.Nodes[0]
	events := &sim.HealthEvents{}
	hw := n.Hardware(sim.WithHealthEvents(events))
	if err := events.Inject(n.Name, 1, sim.HealthEvent{Kind: sim.InjectXID, XID: 79}); !errors.Is(err, sim.ErrNotWatched) {
		t.Fatal(err)
	}
	if err := events.Inject(n.Name, 3, sim.HealthEvent{Kind: sim.InjectGPULost}); err != nil {
		t.Fatal(err)
	}
	inv, err := hw.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m, err := devicemodel.Build(inv)
	if err != nil {
		t.Fatal(err)
	}
	conds, err := hw.(hardware.HealthChecker).CheckHealth(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := WriteTable(&out, []Node{{Name: n.Name, Inventory: inv, Model: m, Health: conds}}); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	t.Log("\n" + text)
	lines := strings.Split(text, "\n")
	from, to := strings.Index(lines[0], "HEALTH"), strings.Index(lines[0], "TAINTS")
	health := map[string]string{}
	for _, line := range lines[1:] {
		if f := strings.Fields(line); len(f) > 2 && f[0] == n.Name && len(line) > to {
			health[f[1]] = strings.TrimSpace(line[from:to])
		}
	}
	for dev, want := range map[string]string{"gpu-0": "ok", "gpu-1": "needs gpu-reset", "gpu-2": "ok", "gpu-7": "ok", "(NVML": "lost"} {
		if got := health[dev]; got != want {
			t.Errorf("%s: HEALTH %q, want %q", dev, got, want)
		}
	}
	if _, ok := health["gpu-3"]; ok {
		t.Error("the lost GPU 3 has a device line")
	}
	for _, want := range []string{
		"(NVML GPU 3)",
		"discovery: GPU 3",
		"health: GPU 1 " + inv.GPUs[1].UUID + ": the driver asks for a gpu-reset before it is used again",
		"health: GPU 3 is lost (NVML_ERROR_GPU_IS_LOST)",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("table lacks %q", want)
		}
	}
	// Without a health check the column says so.
	out.Reset()
	if err := WriteTable(&out, []Node{{Name: n.Name, Inventory: inv, Model: m}}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "needs") || strings.Contains(out.String(), "(NVML GPU") {
		t.Errorf("a table without health data shows health:\n%s", out.String())
	}
}

// TestTableShowsUnreadProperties: a GPU whose memory discovery could not
// read is in the table, without a memory figure, and a line under the
// node names the property, the NVML query and its error.
func TestTableShowsUnreadProperties(t *testing.T) {
	fleet, err := simfleet.Load("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	n := fleet.Nodes[0]
	faults := &sim.Faults{}
	faults.Fail("nvmlDeviceGetMemoryInfo", 1, nvml.ERROR_NOT_SUPPORTED) // GPU 0's
	inv, err := n.Hardware(sim.WithFaults(faults)).Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	m, err := devicemodel.Build(inv)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := WriteTable(&out, []Node{{Name: n.Name, Inventory: inv, Model: m}}); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	t.Log("\n" + text)
	want := "  discovery: GPU 0 (" + inv.GPUs[0].UUID + ") published without memory: nvmlDeviceGetMemoryInfo: ERROR_NOT_SUPPORTED\n"
	if !strings.Contains(text, want) {
		t.Errorf("table lacks %q", want)
	}
	memory := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if f := strings.Fields(line); len(f) > 8 && f[0] == n.Name {
			memory[f[1]] = f[8] // NODE DEVICE TYPE SHARING PRODUCT(4 words) MEMORY
		}
	}
	if memory["gpu-0"] != "-" || memory["gpu-1"] != "81559Mi" {
		t.Errorf("MEMORY of gpu-0 %q, gpu-1 %q; want - and 81559Mi", memory["gpu-0"], memory["gpu-1"])
	}
}
