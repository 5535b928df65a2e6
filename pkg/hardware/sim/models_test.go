package sim

import (
	"maps"
	"slices"
	"testing"

	nvdev "github.com/NVIDIA/go-nvlib/pkg/nvlib/device"
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// The table's profile names must be the ones go-nvlib derives from the
// NVML figures, since discovery names profiles through go-nvlib.
func TestProfileNamesMatchGoNVLib(t *testing.T) {
	devlib := nvdev.New(nil)
	for _, name := range ModelNames() {
		m := models()[name]
		for _, p := range m.MIGProfiles {
			got, err := devlib.NewMigProfile(p.GIProfile, p.CIProfile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED, p.MemoryMiB, m.MemoryMiB*1024*1024)
			if err != nil {
				t.Errorf("%s %s: %v", name, p.Name, err)
				continue
			}
			if got.String() != p.Name {
				t.Errorf("%s: table says %s, go-nvlib names it %s", name, p.Name, got)
			}
		}
	}
}

func TestProfileTablesAreConsistent(t *testing.T) {
	for _, name := range ModelNames() {
		m := models()[name]
		ids := map[int]bool{}
		for _, p := range m.MIGProfiles {
			if ids[p.GIProfile] {
				t.Errorf("%s: GI profile %d listed twice", name, p.GIProfile)
			}
			ids[p.GIProfile] = true
			if p.PlacementSize&(p.PlacementSize-1) != 0 || m.MemorySlices%p.PlacementSize != 0 {
				t.Errorf("%s %s: placement size %d does not tile %d memory slices", name, p.Name, p.PlacementSize, m.MemorySlices)
			}
			for _, s := range p.PlacementStarts {
				if s%p.PlacementSize != 0 || s+p.PlacementSize > m.MemorySlices {
					t.Errorf("%s %s: placement %d:%d is not aligned within %d slices", name, p.Name, s, p.PlacementSize, m.MemorySlices)
				}
			}
			if p.Instances > len(p.PlacementStarts) || p.MemoryMiB > m.MemoryMiB {
				t.Errorf("%s %s: %d instances over %d placements, %d MiB of %d", name, p.Name, p.Instances, len(p.PlacementStarts), p.MemoryMiB, m.MemoryMiB)
			}
		}
	}
}

// go-nvlib's own MIG walk over the fake must see what our discovery sees:
// the fake answers the calls real consumers make, not only ours.
func TestFakeServesGoNVLib(t *testing.T) {
	f, err := loadFleet("dgx-a100-mig")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := f.Node("dgx-a100-0")
	devlib := nvdev.New(newFakeNVML(n))
	got := map[string]string{}
	err = devlib.VisitMigDevices(func(i int, d nvdev.Device, j int, m nvdev.MigDevice) error {
		p, err := m.GetProfile()
		if err != nil {
			return err
		}
		uuid, _ := m.GetUUID()
		got[uuid] = p.String()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for _, g := range n.GPUs {
		for _, d := range g.MIGDevices {
			want[d.UUID] = d.Profile
		}
	}
	if len(got) != 14 || !maps.Equal(got, want) {
		t.Errorf("go-nvlib sees %v, fleet has %v", got, want)
	}
	profiles, err := devlib.GetMigProfiles()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range profiles {
		names = append(names, p.String())
	}
	for _, p := range models()["A100-SXM4-40GB"].MIGProfiles {
		if !slices.Contains(names, p.Name) {
			t.Errorf("go-nvlib does not list profile %s: %v", p.Name, names)
		}
	}
}

// go-nvlib names the compute instances of a split GPU instance as
// nvidia-smi does, from the same fake.
func TestFakeServesGoNVLibSplit(t *testing.T) {
	f, err := parseFleet([]byte(`
nodes:
- name: split
  gpus:
  - model: H100-SXM5-80GB
    migEnabled: true
    migDevices:
    - {profile: 2g.20gb, placementStart: 0, computeSlices: 1}
    - {profile: 3g.40gb, placementStart: 4, computeSlices: 2}
    - {profile: 1g.10gb, placementStart: 2}
`), "split")
	if err != nil {
		t.Fatal(err)
	}
	devlib := nvdev.New(newFakeNVML(&f.Nodes[0]))
	var got []string
	err = devlib.VisitMigDevices(func(i int, d nvdev.Device, j int, m nvdev.MigDevice) error {
		p, err := m.GetProfile()
		if err != nil {
			return err
		}
		got = append(got, p.String())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"1c.2g.20gb", "1c.2g.20gb", "2c.3g.40gb", "1g.10gb"}; !slices.Equal(got, want) {
		t.Errorf("go-nvlib sees %v, want %v", got, want)
	}
}
