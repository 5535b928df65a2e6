package vfio_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/gpudra/gpudra/pkg/vfio"
	"github.com/gpudra/gpudra/pkg/vfio/fakesysfs"
)

// GPU bus IDs of the fixtures.
const (
	gpu      = "0000:1b:00.0" // RTX 6000 Ada, group 27
	audio    = "0000:1b:00.1" // its audio function, group 27
	otherGPU = "0000:2c:00.0" // H100 SXM, group 40
	gpuGroup = 27
)

// node is a fake GPU node: a GPU with its audio function in one IOMMU
// group, and an unrelated GPU in another.
func node(t *testing.T, extra ...func(*fakesysfs.Builder)) *fakesysfs.Sysfs {
	t.Helper()
	b := fakesysfs.NewBuilder().GPUWithAudio(gpu, gpuGroup).GPU(otherGPU, 40)
	for _, e := range extra {
		e(b)
	}
	fake, err := b.Build()
	if err != nil {
		t.Fatalf("build fake sysfs: %v", err)
	}
	return fake
}

// binder returns a Binder on fake, which also answers for busy GPUs and
// module loading.
func binder(t *testing.T, fake *fakesysfs.Sysfs, opts ...vfio.Option) *vfio.Binder {
	t.Helper()
	b, err := vfio.NewBinder(fake, fake, fake, opts...)
	if err != nil {
		t.Fatalf("NewBinder: %v", err)
	}
	return b
}

func plan(t *testing.T, b *vfio.Binder, busID string) vfio.Record {
	t.Helper()
	rec, err := b.Plan(busID)
	if err != nil {
		t.Fatalf("Plan(%s): %v", busID, err)
	}
	return rec
}

// original is how node's functions are bound before anything happens.
var original = map[string]fakesysfs.Binding{
	gpu:      {Driver: "nvidia"},
	audio:    {Driver: "snd_hda_intel"},
	otherGPU: {Driver: "nvidia"},
}

// assertBindings fails unless fake's functions are bound as want says.
func assertBindings(t *testing.T, fake *fakesysfs.Sysfs, want map[string]fakesysfs.Binding) {
	t.Helper()
	got := fake.Bindings()
	if !maps.Equal(got, want) {
		for _, id := range slices.Sorted(maps.Keys(want)) {
			if got[id] != want[id] {
				t.Errorf("function %s: bound %+v, want %+v", id, got[id], want[id])
			}
		}
		t.FailNow()
	}
}

// bound is original with gpu and audio moved to VFIO drivers.
func bound(gpuDriver string) map[string]fakesysfs.Binding {
	want := maps.Clone(original)
	want[gpu] = fakesysfs.Binding{Driver: gpuDriver, Override: gpuDriver}
	want[audio] = fakesysfs.Binding{Driver: vfio.VFIOPCI, Override: vfio.VFIOPCI}
	return want
}
