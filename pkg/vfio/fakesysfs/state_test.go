package fakesysfs_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"

	"github.com/gpudra/gpudra/pkg/vfio/fakesysfs"
)

// bindToVFIO binds the GPU to vfio-pci as the binder does.
func bindToVFIO(t *testing.T, s *fakesysfs.Sysfs) {
	t.Helper()
	if err := s.Load(context.Background(), "vfio-pci"); err != nil {
		t.Fatal(err)
	}
	for _, w := range []write{
		{dev(gpu, "driver/unbind"), gpu, 0},
		{dev(gpu, "driver_override"), "vfio-pci\n", 0},
		{drv("vfio-pci", "bind"), gpu, 0},
	} {
		if err := s.WriteFile(w.path, []byte(w.value)); err != nil {
			t.Fatalf("write %s: %v", w.path, err)
		}
	}
}

func TestStateFileOutlivesTheProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sysfs.json")
	builder := func() *fakesysfs.Builder { return fakesysfs.NewBuilder().IOMMUFD().GPU(gpu, 20).StateFile(path) }
	s := build(t, builder())
	if st, err := fakesysfs.ReadState(path); err != nil || st == nil || st.Functions[gpu].Driver != "nvidia" {
		t.Fatalf("state file of a new fake: %+v, %v", st, err)
	}
	bindToVFIO(t, s)
	n, _ := s.VFIODevice(gpu)

	// The next process sees the GPU bound to vfio-pci, its nodes, and the
	// module loaded.
	again := build(t, builder())
	if got, want := again.Bindings(), s.Bindings(); !reflect.DeepEqual(got, want) {
		t.Errorf("bindings after a restart %v, want %v", got, want)
	}
	if m, ok := again.VFIODevice(gpu); !ok || m != n {
		t.Errorf("VFIO device after a restart %d, %v; want %d", m, ok, n)
	}
	if got := again.VFIOGroups(); !reflect.DeepEqual(got, []int{20}) {
		t.Errorf("VFIO groups after a restart %v, want [20]", got)
	}
	if !again.DriverLoaded("vfio-pci") {
		t.Error("vfio-pci no longer loaded after a restart")
	}
	// Its writes meet the kernel's rules as they stand.
	if err := again.WriteFile(drv("nvidia", "bind"), []byte(gpu)); !errors.Is(err, syscall.ENODEV) {
		t.Errorf("bind to nvidia while driver_override names vfio-pci: %v, want ENODEV", err)
	}
}

func TestStateFileWriteFailureUndoesTheWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sysfs.json")
	s := build(t, fakesysfs.NewBuilder().GPU(gpu, 20).StateFile(path))
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteFile(dev(gpu, "driver/unbind"), []byte(gpu)); !errors.Is(err, syscall.EIO) {
		t.Errorf("unbind without its state file: %v, want EIO", err)
	}
	if b, _ := s.Binding(gpu); b.Driver != "nvidia" {
		t.Errorf("a write that could not be kept took effect: %+v", b)
	}
}

func TestStateFileThatDoesNotFitFailsTheBuild(t *testing.T) {
	for name, content := range map[string]string{
		"garbage":        "{",
		"other function": `{"version":"v1","functions":{"0000:99:00.0":{"vfioDev":-1}},"loaded":["nvidia"]}`,
		"unknown driver": `{"version":"v1","functions":{"` + gpu + `":{"driver":"nouveau","vfioDev":-1}},"loaded":["nouveau"]}`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "sysfs.json")
			if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := fakesysfs.NewBuilder().GPU(gpu, 20).StateFile(path).Build(); err == nil {
				t.Error("Build accepted a state file that does not fit")
			}
		})
	}
}

// Two processes drive one node's kernel at once (a rolling update): each
// sees the bindings the other made.
func TestStateFileSharedByTwoProcesses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sysfs.json")
	builder := func() *fakesysfs.Builder { return fakesysfs.NewBuilder().IOMMUFD().GPU(gpu, 20).StateFile(path) }
	a, b := build(t, builder()), build(t, builder()) // both before any binding
	bindToVFIO(t, a)
	if got, _ := b.Binding(gpu); got.Driver != "vfio-pci" {
		t.Fatalf("B sees the GPU bound to %q after A bound it to vfio-pci", got.Driver)
	}
	// B gives it back to nvidia, as the other instance's Unprepare does.
	for _, w := range []write{
		{dev(gpu, "driver/unbind"), gpu, 0},
		{dev(gpu, "driver_override"), "\n", 0},
		{drv("nvidia", "bind"), gpu, 0},
	} {
		if err := b.WriteFile(w.path, []byte(w.value)); err != nil {
			t.Fatalf("B: write %s: %v", w.path, err)
		}
	}
	if got, _ := a.Binding(gpu); got.Driver != "nvidia" || got.Override != "" {
		t.Errorf("A sees %+v after B gave the GPU back to nvidia", got)
	}
	if st, err := fakesysfs.ReadState(path); err != nil || st.Functions[gpu].Driver != "nvidia" {
		t.Errorf("state file %+v, %v; want the GPU bound to nvidia", st, err)
	}
}
