package sim

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpudra/gpudra/pkg/hardware"
)

// migTable is one file of testdata/mig: what nvidia-smi mig -lgip and
// -lgipp print for a GPU model (see testdata/mig/README.md).
type migTable struct {
	model        string
	memorySlices int
	rows         []lgipRow // in -lgip order
	placements   map[int]lgippRow
}

// lgipRow is one profile of -lgip.
type lgipRow struct {
	name                        string
	id, instances               int
	gib                         string // as nvidia-smi prints it
	sm, dec, enc, ce, jpeg, ofa int
	slices                      int // the "g" of the name
}

// lgippRow is one profile of -lgipp.
type lgippRow struct {
	starts []int
	size   int
}

func atoi(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a non-negative integer", s)
	}
	return n, nil
}

// parseMIGTable reads one testdata/mig file.
func parseMIGTable(path string) (*migTable, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t := &migTable{placements: map[int]lgippRow{}}
	scanner := bufio.NewScanner(f)
	for line := 1; scanner.Scan(); line++ {
		text, _, _ := strings.Cut(scanner.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		if err := t.parseRecord(fields); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
	}
	if err := scanner.Err(); err != nil {
		return nil, err
	}
	if t.model == "" || t.memorySlices == 0 || len(t.rows) == 0 {
		return nil, fmt.Errorf("%s: want model, memory-slices and lgip records", path)
	}
	return t, nil
}

func (t *migTable) parseRecord(fields []string) error {
	want := map[string]int{"model": 2, "memory-slices": 2, "lgip": 11, "lgipp": 4}
	n, ok := want[fields[0]]
	if !ok {
		return fmt.Errorf("unknown record %q", fields[0])
	}
	if len(fields) != n {
		return fmt.Errorf("%s: want %d fields, got %d", fields[0], n, len(fields))
	}
	var err error
	switch fields[0] {
	case "model":
		t.model = fields[1]
	case "memory-slices":
		t.memorySlices, err = atoi(fields[1])
	case "lgip":
		r := lgipRow{name: fields[1], gib: fields[4]}
		g, _, _ := strings.Cut(r.name, "g.")
		for dst, src := range map[*int]string{
			&r.slices: g, &r.id: fields[2], &r.instances: fields[3],
			&r.sm: fields[5], &r.dec: fields[6], &r.enc: fields[7], &r.ce: fields[8], &r.jpeg: fields[9], &r.ofa: fields[10],
		} {
			if *dst, err = atoi(src); err != nil {
				return fmt.Errorf("lgip %s: %w", r.name, err)
			}
		}
		t.rows = append(t.rows, r)
	case "lgipp":
		var p lgippRow
		id, err := atoi(fields[1])
		if err != nil {
			return err
		}
		for _, s := range strings.Split(fields[2], ",") {
			start, err := atoi(s)
			if err != nil {
				return err
			}
			p.starts = append(p.starts, start)
		}
		if p.size, err = atoi(fields[3]); err != nil {
			return err
		}
		t.placements[id] = p
	}
	return err
}

// gib prints MiB as nvidia-smi prints GiB.
func gib(mib uint64) string { return fmt.Sprintf("%.2f", float64(mib)/1024) }

// The model tables, the fake's NVML answers and what discovery makes of
// them all agree with the figures in testdata/mig.
func TestMIGTablesMatchTestdata(t *testing.T) {
	paths, err := filepath.Glob("testdata/mig/*.txt")
	if err != nil {
		t.Fatal(err)
	}
	var covered []string
	for _, path := range paths {
		table, err := parseMIGTable(path)
		if err != nil {
			t.Fatal(err)
		}
		covered = append(covered, table.model)
		t.Run(table.model, func(t *testing.T) {
			m, ok := models()[table.model]
			if !ok {
				t.Fatalf("models.go has no model %s", table.model)
			}
			checkModelTable(t, m, table)
			checkFakeAnswers(t, m, table)
			checkDiscoveredProfiles(t, m, table)
		})
	}
	var migModels []string
	for _, name := range ModelNames() {
		if len(models()[name].MIGProfiles) > 0 {
			migModels = append(migModels, name)
		}
	}
	slices.Sort(covered)
	if !slices.Equal(covered, migModels) {
		t.Errorf("testdata/mig covers %v; the MIG-capable models are %v", covered, migModels)
	}
}

// checkModelTable compares models.go's table with the file, row by row in
// -lgip order.
func checkModelTable(t *testing.T, m *Model, table *migTable) {
	t.Helper()
	if m.MemorySlices != table.memorySlices || len(m.MIGProfiles) != len(table.rows) {
		t.Fatalf("models.go: %d memory slices, %d profiles; testdata: %d, %d",
			m.MemorySlices, len(m.MIGProfiles), table.memorySlices, len(table.rows))
	}
	for i, r := range table.rows {
		p := m.MIGProfiles[i]
		got := lgipRow{p.Name, p.ID, p.Instances, gib(p.MemoryMiB), p.Multiprocessors, p.Decoders, p.Encoders,
			p.CopyEngines, p.JPEGEngines, p.OFAEngines, p.Slices}
		if got != r {
			t.Errorf("models.go row %d:\n got %+v\nwant %+v", i, got, r)
		}
		want := table.placements[r.id]
		if p.PlacementSize != want.size || !slices.Equal(p.PlacementStarts, want.starts) {
			t.Errorf("models.go %s placements %v:%d, want %v:%d", p.Name, p.PlacementStarts, p.PlacementSize, want.starts, want.size)
		}
	}
	if len(table.placements) != len(table.rows) {
		t.Errorf("testdata has placements for %d profiles, -lgip rows for %d", len(table.placements), len(table.rows))
	}
}

// checkFakeAnswers asks the fake NVML of a GPU of the model, MIG mode off,
// what real NVML would be asked.
func checkFakeAnswers(t *testing.T, m *Model, table *migTable) {
	t.Helper()
	dev := newFakeNVML(oneGPUNode(t, m.Name, false)).devices[0]
	seen := map[int]bool{}
	for i := 0; i < nvml.GPU_INSTANCE_PROFILE_COUNT; i++ {
		info, ret := dev.GetGpuInstanceProfileInfo(i)
		if ret == nvml.ERROR_NOT_SUPPORTED {
			continue
		}
		if ret != nvml.SUCCESS {
			t.Fatalf("GetGpuInstanceProfileInfo(%d): %v", i, ret)
		}
		j := slices.IndexFunc(table.rows, func(r lgipRow) bool { return r.id == int(info.Id) })
		if j < 0 {
			t.Errorf("profile index %d has ID %d, which testdata does not list", i, info.Id)
			continue
		}
		seen[int(info.Id)] = true
		r := table.rows[j]
		got := lgipRow{r.name, int(info.Id), int(info.InstanceCount), gib(info.MemorySizeMB), int(info.MultiprocessorCount),
			int(info.DecoderCount), int(info.EncoderCount), int(info.CopyEngineCount), int(info.JpegCount), int(info.OfaCount), int(info.SliceCount)}
		if got != r {
			t.Errorf("GetGpuInstanceProfileInfo(%d):\n got %+v\nwant %+v", i, got, r)
		}
		placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			t.Fatalf("GetGpuInstancePossiblePlacements(%d): %v", info.Id, ret)
		}
		want := table.placements[r.id]
		var starts []int
		for _, pl := range placements {
			starts = append(starts, int(pl.Start))
			if int(pl.Size) != want.size {
				t.Errorf("profile %d: placement %d has size %d, want %d", r.id, pl.Start, pl.Size, want.size)
			}
		}
		if !slices.Equal(starts, want.starts) {
			t.Errorf("profile %d: placements %v, want %v", r.id, starts, want.starts)
		}
	}
	if len(seen) != len(table.rows) {
		t.Errorf("the fake lists profile IDs %v, testdata %d profiles", seen, len(table.rows))
	}
}

// checkDiscoveredProfiles runs discovery over the fake, once with MIG mode
// off and once on.
func checkDiscoveredProfiles(t *testing.T, m *Model, table *migTable) {
	t.Helper()
	for _, on := range []bool{false, true} {
		inv, err := oneGPUNode(t, m.Name, on).Hardware().Discover(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		g := inv.GPUs[0]
		if g.MIGMemorySlices != table.memorySlices || len(g.MIGProfiles) != len(table.rows) {
			t.Fatalf("MIG %v: discovered %d memory slices, %d profiles", on, g.MIGMemorySlices, len(g.MIGProfiles))
		}
		for _, p := range g.MIGProfiles {
			j := slices.IndexFunc(table.rows, func(r lgipRow) bool { return r.id == p.ProfileID })
			if j < 0 {
				t.Errorf("discovered profile %+v is not in testdata", p)
				continue
			}
			r := table.rows[j]
			got := lgipRow{p.Name, p.ProfileID, p.Instances, gib(p.MemoryBytes >> 20), p.Multiprocessors, p.Decoders, p.Encoders,
				p.CopyEngines, p.JPEGEngines, p.OFAEngines, p.Slices}
			want := table.placements[r.id]
			if got != r || p.PlacementSize != want.size || !slices.Equal(p.PlacementStarts, want.starts) {
				t.Errorf("MIG %v: discovered %+v, want %+v with placements %v:%d", on, p, r, want.starts, want.size)
			}
			if p.CIProfileID != m.MIGProfiles[j].CIProfile || p.CIEngProfileID != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED {
				t.Errorf("MIG %v: %s spans with CI profile %d/%d", on, p.Name, p.CIProfileID, p.CIEngProfileID)
			}
		}
		if !slices.IsSortedFunc(g.MIGProfiles, func(a, b hardware.MIGProfile) int { return a.GIProfileID - b.GIProfileID }) {
			t.Errorf("MIG %v: profiles not in NVML index order", on)
		}
	}
}

// oneGPUNode is a resolved node with one GPU of the model.
func oneGPUNode(t *testing.T, model string, migEnabled bool) *Node {
	t.Helper()
	f, err := parseFleet(fmt.Appendf(nil, "nodes:\n- name: n0\n  gpus:\n  - model: %s\n    migEnabled: %v\n", model, migEnabled), t.Name())
	if err != nil {
		t.Fatal(err)
	}
	return &f.Nodes[0]
}

// On A30 the 1g.6gb+me and 2g.12gb+me profiles each take the GPU's only
// JPEG and OFA engine: with one of them, NVML has no room for the other,
// though placements and instance counts would allow it.
func TestFakeRefusesMIGBeyondEngines(t *testing.T) {
	dev := newFakeNVML(oneGPUNode(t, "A30-24GB", true)).devices[0]
	info := func(index int) *nvml.GpuInstanceProfileInfo {
		i, ret := dev.GetGpuInstanceProfileInfo(index)
		if ret != nvml.SUCCESS {
			t.Fatalf("GetGpuInstanceProfileInfo(%d): %v", index, ret)
		}
		return &i
	}
	oneMe, twoMe, two := info(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1), info(nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1), info(nvml.GPU_INSTANCE_PROFILE_2_SLICE)
	if _, ret := dev.CreateGpuInstanceWithPlacement(oneMe, &nvml.GpuInstancePlacement{Start: 0, Size: 1}); ret != nvml.SUCCESS {
		t.Fatalf("create 1g.6gb+me: %v", ret)
	}
	if n, ret := dev.GetGpuInstanceRemainingCapacity(twoMe); ret != nvml.SUCCESS || n != 0 {
		t.Errorf("remaining 2g.12gb+me: %d, %v; want 0", n, ret)
	}
	if n, ret := dev.GetGpuInstanceRemainingCapacity(two); ret != nvml.SUCCESS || n != 1 {
		t.Errorf("remaining 2g.12gb: %d, %v; want 1", n, ret)
	}
	if _, ret := dev.CreateGpuInstanceWithPlacement(twoMe, &nvml.GpuInstancePlacement{Start: 2, Size: 2}); ret != nvml.ERROR_INSUFFICIENT_RESOURCES {
		t.Errorf("create 2g.12gb+me beside 1g.6gb+me: %v, want ERROR_INSUFFICIENT_RESOURCES", ret)
	}
	if _, ret := dev.CreateGpuInstanceWithPlacement(two, &nvml.GpuInstancePlacement{Start: 2, Size: 2}); ret != nvml.SUCCESS {
		t.Errorf("create 2g.12gb: %v", ret)
	}
}
