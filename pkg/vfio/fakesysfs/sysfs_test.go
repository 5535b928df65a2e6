package fakesysfs_test

import (
	"context"
	"errors"
	"io/fs"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/gpudra/gpudra/pkg/vfio/fakesysfs"
)

const (
	gpu   = "0000:1b:00.0"
	audio = "0000:1b:00.1"
)

func build(t *testing.T, b *fakesysfs.Builder) *fakesysfs.Sysfs {
	t.Helper()
	s, err := b.Build()
	if err != nil {
		t.Fatalf("Build: %v", err)
	}
	return s
}

// write is one write to the fake and the errno it must fail with (0: none).
type write struct {
	path, value string
	errno       syscall.Errno
}

func dev(busID, attr string) string { return "bus/pci/devices/" + busID + "/" + attr }
func drv(name, attr string) string  { return "bus/pci/drivers/" + name + "/" + attr }

// TestKernelModel plays sequences of writes against a GPU with its audio
// function and checks the errnos and the resulting bindings.
func TestKernelModel(t *testing.T) {
	tests := map[string]struct {
		loadVFIO bool
		writes   []write
		want     map[string]fakesysfs.Binding
	}{
		"bind of a driver whose module is not loaded: no such file": {
			writes: []write{
				{dev(gpu, "driver/unbind"), gpu, 0},
				{drv("vfio-pci", "bind"), gpu, syscall.ENOENT},
			},
			want: map[string]fakesysfs.Binding{gpu: {}, audio: {Driver: "snd_hda_intel"}},
		},
		"vfio-pci takes a device only through driver_override": {
			loadVFIO: true,
			writes: []write{
				{dev(gpu, "driver/unbind"), gpu, 0},
				{drv("vfio-pci", "bind"), gpu, syscall.ENODEV},
				{dev(gpu, "driver_override"), "vfio-pci\n", 0},
				{drv("vfio-pci", "bind"), gpu, 0},
			},
			want: map[string]fakesysfs.Binding{gpu: {Driver: "vfio-pci", Override: "vfio-pci"}, audio: {Driver: "snd_hda_intel"}},
		},
		"bind of a bound device: busy": {
			loadVFIO: true,
			writes: []write{
				{dev(gpu, "driver_override"), "vfio-pci", 0},
				{drv("vfio-pci", "bind"), gpu, syscall.EBUSY},
			},
			want: map[string]fakesysfs.Binding{gpu: {Driver: "nvidia", Override: "vfio-pci"}, audio: {Driver: "snd_hda_intel"}},
		},
		"an override excludes the device's own driver": {
			loadVFIO: true,
			writes: []write{
				{dev(gpu, "driver_override"), "vfio-pci", 0},
				{dev(gpu, "driver/unbind"), gpu, 0},
				{drv("nvidia", "bind"), gpu, syscall.ENODEV},
				{dev(gpu, "driver_override"), "\n", 0},
				{drv("nvidia", "bind"), gpu, 0},
			},
			want: map[string]fakesysfs.Binding{gpu: {Driver: "nvidia"}, audio: {Driver: "snd_hda_intel"}},
		},
		"a driver that does not match the device": {
			writes: []write{
				{dev(audio, "driver/unbind"), audio, 0},
				{drv("nvidia", "bind"), audio, syscall.ENODEV},
			},
			want: map[string]fakesysfs.Binding{gpu: {Driver: "nvidia"}, audio: {}},
		},
		"unbind of an unbound device: no driver link to write through": {
			writes: []write{
				{dev(gpu, "driver/unbind"), gpu, 0},
				{dev(gpu, "driver/unbind"), gpu, syscall.ENOENT},
				{drv("nvidia", "unbind"), gpu, syscall.ENODEV},
			},
			want: map[string]fakesysfs.Binding{gpu: {}, audio: {Driver: "snd_hda_intel"}},
		},
		"unbind names another driver's device": {
			writes: []write{
				{drv("nvidia", "unbind"), audio, syscall.ENODEV},
				{drv("nvidia", "bind"), "0000:99:00.0", syscall.ENODEV},
			},
			want: map[string]fakesysfs.Binding{gpu: {Driver: "nvidia"}, audio: {Driver: "snd_hda_intel"}},
		},
		"drivers_probe binds to the override, or to a matching driver": {
			loadVFIO: true,
			writes: []write{
				{dev(gpu, "driver_override"), "vfio-pci", 0},
				{dev(gpu, "driver/unbind"), gpu, 0},
				{"bus/pci/drivers_probe", gpu, 0},
				{dev(audio, "driver/unbind"), audio, 0},
				{"bus/pci/drivers_probe", audio, 0},
				{"bus/pci/drivers_probe", "0000:99:00.0", syscall.ENODEV},
			},
			want: map[string]fakesysfs.Binding{gpu: {Driver: "vfio-pci", Override: "vfio-pci"}, audio: {Driver: "snd_hda_intel"}},
		},
		"drivers_probe with an override whose module is not loaded: stays unbound": {
			writes: []write{
				{dev(gpu, "driver_override"), "vfio-pci", 0},
				{dev(gpu, "driver/unbind"), gpu, 0},
				{"bus/pci/drivers_probe", gpu, 0},
			},
			want: map[string]fakesysfs.Binding{gpu: {Override: "vfio-pci"}, audio: {Driver: "snd_hda_intel"}},
		},
		"read-only attributes and directories refuse writes": {
			writes: []write{
				{dev(gpu, "vendor"), "0x8086", syscall.EACCES},
				{dev(gpu, ""), "x", syscall.EISDIR},
				{"bus/pci/devices/../../etc/passwd", "x", syscall.ENOENT},
			},
			want: map[string]fakesysfs.Binding{gpu: {Driver: "nvidia"}, audio: {Driver: "snd_hda_intel"}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			s := build(t, fakesysfs.NewBuilder().GPUWithAudio(gpu, 27))
			if tc.loadVFIO {
				if err := s.Load(context.Background(), "vfio_pci"); err != nil {
					t.Fatalf("Load: %v", err)
				}
			}
			for i, w := range tc.writes {
				err := s.WriteFile(strings.TrimSuffix(w.path, "/"), []byte(w.value))
				switch {
				case w.errno == 0 && err != nil:
					t.Fatalf("write %d, %q to %s: %v", i, w.value, w.path, err)
				case w.errno != 0 && !errors.Is(err, w.errno):
					t.Fatalf("write %d, %q to %s = %v, want %v", i, w.value, w.path, err, w.errno)
				}
			}
			if got := s.Bindings(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("bindings %v, want %v", got, tc.want)
			}
		})
	}
}

func TestBusyUnbind(t *testing.T) {
	s := build(t, fakesysfs.NewBuilder().GPUWithAudio(gpu, 27))
	if err := s.SetHolders(gpu, "nvidia-persistenced (pid 4)"); err != nil {
		t.Fatal(err)
	}
	holders, err := s.Holders(context.Background(), gpu)
	if err != nil || !reflect.DeepEqual(holders, []string{"nvidia-persistenced (pid 4)"}) {
		t.Fatalf("Holders = %v, %v", holders, err)
	}
	err = s.WriteFile(dev(gpu, "driver/unbind"), []byte(gpu))
	var pe *fs.PathError
	if !errors.Is(err, syscall.EBUSY) || !errors.As(err, &pe) || pe.Path != "/sys/"+dev(gpu, "driver/unbind") {
		t.Fatalf("unbind of a held GPU = %v, want EBUSY on /sys/%s", err, dev(gpu, "driver/unbind"))
	}
	if b, _ := s.Binding(gpu); b.Driver != "nvidia" {
		t.Errorf("held GPU unbound anyway: %+v", b)
	}
	if err := s.SetHolders(gpu); err != nil {
		t.Fatal(err)
	}
	if err := s.WriteFile(dev(gpu, "driver/unbind"), []byte(gpu)); err != nil {
		t.Errorf("unbind once free: %v", err)
	}
}

// TestVFIONodes follows the VFIO nodes of a group through binds and
// unbinds.
func TestVFIONodes(t *testing.T) {
	s := build(t, fakesysfs.NewBuilder().IOMMUFD().GPUWithAudio(gpu, 27).GPU("0000:2c:00.0", 40))
	read := func(name string) string {
		t.Helper()
		data, err := s.ReadFile(name)
		if err != nil {
			t.Fatalf("read %s: %v", name, err)
		}
		return strings.TrimSpace(string(data))
	}
	exists := func(name string) bool {
		t.Helper()
		ok, err := s.Exists(name)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if exists("class/misc/vfio") {
		t.Error("/dev/vfio/vfio before the VFIO core is loaded")
	}
	if got := read("class/misc/iommu/dev"); got != "10:126" {
		t.Errorf("/dev/iommu is %s", got)
	}
	if err := s.Load(context.Background(), "vfio-pci"); err != nil {
		t.Fatal(err)
	}
	if got := read("class/misc/vfio/dev"); got != "10:196" {
		t.Errorf("/dev/vfio/vfio is %s", got)
	}
	move := func(busID string) {
		t.Helper()
		for _, w := range [][2]string{{dev(busID, "driver_override"), "vfio-pci"}, {dev(busID, "driver/unbind"), busID}, {drv("vfio-pci", "bind"), busID}} {
			if err := s.WriteFile(w[0], []byte(w[1])); err != nil {
				t.Fatalf("write %s: %v", w[0], err)
			}
		}
	}
	move("0000:2c:00.0")
	move(audio)
	move(gpu)
	if got := read(dev(gpu, "vfio-dev/vfio2/dev")); got != "507:2" {
		t.Errorf("GPU's vfio-dev node is %s", got)
	}
	if names, _ := s.ReadDir("class/vfio"); !reflect.DeepEqual(names, []string{"27", "40"}) {
		t.Errorf("class/vfio lists %v", names)
	}
	if got := read("class/vfio/27/dev"); got != "508:1" {
		t.Errorf("group 27's node is %s", got)
	}
	if target, _ := s.Readlink(dev(gpu, "driver")); target != "../../../../bus/pci/drivers/vfio-pci" {
		t.Errorf("driver link points at %s", target)
	}

	// The group's node lives while one of its functions is bound to VFIO.
	if err := s.WriteFile(dev(gpu, "driver/unbind"), []byte(gpu)); err != nil {
		t.Fatal(err)
	}
	if exists(dev(gpu, "vfio-dev")) || exists(dev(gpu, "driver")) || !exists("class/vfio/27/dev") {
		t.Error("after unbinding the GPU: want no vfio-dev, no driver, the group node kept")
	}
	if err := s.WriteFile(dev(audio, "driver/unbind"), []byte(audio)); err != nil {
		t.Fatal(err)
	}
	if exists("class/vfio/27") || !exists("class/vfio/40/dev") {
		t.Error("after unbinding the group: want group 27's node gone, group 40's kept")
	}
	if names, _ := s.ReadDir("kernel/iommu_groups/27/devices"); !reflect.DeepEqual(names, []string{gpu, audio}) {
		t.Errorf("group 27 lists %v", names)
	}
}

func TestNoIOMMU(t *testing.T) {
	s := build(t, fakesysfs.NewBuilder().NoIOMMU().GPU(gpu, 0))
	if err := s.Load(context.Background(), "vfio-pci"); err != nil {
		t.Fatal(err)
	}
	for _, w := range [][2]string{{dev(gpu, "driver_override"), "vfio-pci"}, {dev(gpu, "driver/unbind"), gpu}} {
		if err := s.WriteFile(w[0], []byte(w[1])); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.WriteFile(drv("vfio-pci", "bind"), []byte(gpu)); !errors.Is(err, syscall.EINVAL) {
		t.Errorf("vfio-pci bind without IOMMU = %v, want EINVAL", err)
	}
	if ok, _ := s.Exists(dev(gpu, "iommu_group")); ok {
		t.Error("iommu_group link without IOMMU")
	}
	if names, err := s.ReadDir("kernel/iommu_groups"); err != nil || len(names) != 0 {
		t.Errorf("iommu_groups = %v, %v; want empty", names, err)
	}
}

func TestFaults(t *testing.T) {
	s := build(t, fakesysfs.NewBuilder().GPUWithAudio(gpu, 27))
	s.InjectFault(fakesysfs.Fault{Op: fakesysfs.OpRead, Path: dev(gpu, "vendor"), Err: syscall.EIO, Skip: 1, Times: 2})
	var errs []error
	for range 4 {
		_, err := s.ReadFile(dev(gpu, "vendor"))
		errs = append(errs, err)
	}
	if errs[0] != nil || !errors.Is(errs[1], syscall.EIO) || !errors.Is(errs[2], syscall.EIO) || errs[3] != nil {
		t.Errorf("reads with Skip 1, Times 2 = %v, want ok, EIO, EIO, ok", errs)
	}
	if _, err := s.ReadFile(dev(audio, "vendor")); err != nil {
		t.Errorf("fault hit another path: %v", err)
	}

	s.InjectFault(fakesysfs.Fault{Op: fakesysfs.OpLoadModule, Err: syscall.ENOMEM, Times: 1})
	if err := s.Load(context.Background(), "vfio-pci"); !errors.Is(err, syscall.ENOMEM) || s.DriverLoaded("vfio-pci") {
		t.Errorf("Load with a fault = %v, loaded %t", err, s.DriverLoaded("vfio-pci"))
	}
	if err := s.Load(context.Background(), "no-such-module"); err == nil || !strings.Contains(err.Error(), "Module no-such-module not found") {
		t.Errorf("Load of an unknown module = %v", err)
	}

	// A crash after one write stops everything, a restart sees its effect.
	s.CrashAfterWrites(1)
	if err := s.WriteFile(dev(gpu, "driver_override"), []byte("vfio-pci")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReadFile(dev(gpu, "vendor")); !errors.Is(err, fakesysfs.ErrCrashed) {
		t.Errorf("read after the crash = %v", err)
	}
	if err := s.WriteFile(dev(gpu, "driver/unbind"), []byte(gpu)); !errors.Is(err, fakesysfs.ErrCrashed) {
		t.Errorf("write after the crash = %v", err)
	}
	s.Restart()
	if b, _ := s.Binding(gpu); b != (fakesysfs.Binding{Driver: "nvidia", Override: "vfio-pci"}) {
		t.Errorf("after restart: %+v", b)
	}
	if n := s.Writes(); n != 1 {
		t.Errorf("Writes() = %d, want 1", n)
	}
}

func TestBuilderErrors(t *testing.T) {
	for name, f := range map[string]fakesysfs.Function{
		"bad bus ID":            {BusID: "1b:00.0", Vendor: "10de", Device: "2330", Class: "030200"},
		"bad vendor":            {BusID: gpu, Vendor: "10DE", Device: "2330", Class: "030200"},
		"driver not loaded":     {BusID: gpu, Vendor: "10de", Device: "2330", Class: "030200", Driver: "vfio-pci"},
		"driver does not match": {BusID: gpu, Vendor: "10de", Device: "2330", Class: "030200", Driver: "snd_hda_intel"},
		"negative group":        {BusID: gpu, Vendor: "10de", Device: "2330", Class: "030200", IOMMUGroup: -1},
	} {
		if _, err := fakesysfs.NewBuilder().Function(f).Build(); err == nil {
			t.Errorf("%s: Build succeeded", name)
		}
	}
	if _, err := fakesysfs.NewBuilder().GPU(gpu, 1).GPU(gpu, 2).Build(); err == nil {
		t.Error("a function added twice: Build succeeded")
	}
}
