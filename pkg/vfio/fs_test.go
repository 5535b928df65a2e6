package vfio_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/vfio"
	"github.com/gpudra/gpudra/pkg/vfio/fakesysfs"
)

// sysfsTree lays out in a temporary directory what a host's sysfs shows of
// an unbound-from-VFIO RTX 6000 Ada at 0000:1b:00.0 in IOMMU group 27, with
// the links real sysfs has, and returns its root.
func sysfsTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	dev := "devices/pci0000:00/0000:00:01.0/0000:1b:00.0"
	files := map[string]string{
		dev + "/vendor":                  "0x10de\n",
		dev + "/device":                  "0x26b1\n",
		dev + "/class":                   "0x030000\n",
		dev + "/driver_override":         "(null)\n",
		"bus/pci/drivers/nvidia/bind":    "",
		"bus/pci/drivers/nvidia/unbind":  "",
		"bus/pci/drivers_probe":          "",
		"class/misc/iommu/dev":           "10:126\n",
		"kernel/iommu_groups/3/type":     "DMA\n",
		"kernel/iommu_groups/27/type":    "DMA-FQ\n",
		"kernel/iommu_groups/27/devices": "",
	}
	links := map[string]string{
		"bus/pci/devices/0000:1b:00.0":                "../../../" + dev,
		dev + "/driver":                               "../../../../bus/pci/drivers/nvidia",
		dev + "/iommu_group":                          "../../../../kernel/iommu_groups/27",
		"kernel/iommu_groups/27/devices/0000:1b:00.0": "../../../../" + dev,
	}
	for name, content := range files {
		p := filepath.Join(root, name)
		if content == "" && !strings.Contains(name, "bind") && !strings.Contains(name, "probe") {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for name, target := range links {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestDirAndFakeAgree reads the same machine through Dir on a directory
// laid out like sysfs and through the fake.
func TestDirAndFakeAgree(t *testing.T) {
	dir := vfio.Dir(sysfsTree(t))
	fake, err := fakesysfs.NewBuilder().IOMMUFD().
		Function(fakesysfs.Function{BusID: gpu, Vendor: "10de", Device: "26b1", Class: "030000", IOMMUGroup: gpuGroup, Driver: "nvidia"}).
		Build()
	if err != nil {
		t.Fatal(err)
	}
	want := vfio.PCIDevice{BusID: gpu, VendorID: "10de", DeviceID: "26b1", Class: "030000", IOMMUGroup: ptr.To(gpuGroup), Driver: "nvidia"}
	wantRec := vfio.Record{GPU: gpu, IOMMUGroup: gpuGroup, Functions: []vfio.Function{{BusID: gpu, Driver: vfio.VFIOPCI, OriginalDriver: "nvidia"}}}
	for name, fsys := range map[string]vfio.FS{"Dir": dir, "fake": fake} {
		t.Run(name, func(t *testing.T) {
			got, err := vfio.ReadPCIDevice(fsys, gpu)
			if err != nil {
				t.Fatalf("ReadPCIDevice: %v", err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("ReadPCIDevice = %+v, want %+v", got, want)
			}
			if ok, err := vfio.IOMMUEnabled(fsys); err != nil || !ok {
				t.Errorf("IOMMUEnabled = %t, %v; want true", ok, err)
			}
			if ok, err := vfio.IOMMUFDAvailable(fsys); err != nil || !ok {
				t.Errorf("IOMMUFDAvailable = %t, %v; want true", ok, err)
			}
			b, err := vfio.NewBinder(fsys, vfio.NotBusy{}, vfio.Modprobe{Command: []string{"false"}})
			if err != nil {
				t.Fatal(err)
			}
			if rec := plan(t, b, gpu); !reflect.DeepEqual(rec, wantRec) {
				t.Errorf("Plan = %+v, want %+v", rec, wantRec)
			}
			if _, err := vfio.ReadPCIDevice(fsys, "0000:99:00.0"); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("ReadPCIDevice of a missing device = %v, want fs.ErrNotExist", err)
			}
		})
	}
}

func TestDir(t *testing.T) {
	root := sysfsTree(t)
	dir := vfio.Dir(root)

	if err := dir.WriteFile("bus/pci/drivers/nvidia/unbind", []byte("0000:1b:00.0")); err != nil {
		t.Fatalf("WriteFile: %v", err)
	}
	if data, _ := os.ReadFile(filepath.Join(root, "bus/pci/drivers/nvidia/unbind")); string(data) != "0000:1b:00.0" {
		t.Errorf("unbind holds %q after WriteFile", data)
	}
	err := dir.WriteFile("bus/pci/drivers/vfio-pci/bind", []byte("0000:1b:00.0"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("WriteFile to a missing attribute = %v, want fs.ErrNotExist", err)
	}
	if _, err := os.Stat(filepath.Join(root, "bus/pci/drivers/vfio-pci")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("WriteFile created a driver directory: %v", err)
	}

	if names, err := dir.ReadDir("kernel/iommu_groups"); err != nil || !reflect.DeepEqual(names, []string{"27", "3"}) {
		t.Errorf("ReadDir = %v, %v; want [27 3]", names, err)
	}
	if target, err := dir.Readlink("bus/pci/devices/0000:1b:00.0/driver"); err != nil || !strings.HasSuffix(target, "/nvidia") {
		t.Errorf("Readlink = %q, %v", target, err)
	}
	for name, want := range map[string]bool{
		"bus/pci/devices/0000:1b:00.0":          true, // a link to a directory
		"bus/pci/devices/0000:1b:00.0/driver":   true,
		"bus/pci/devices/0000:1b:00.0/vfio-dev": false,
	} {
		if got, err := dir.Exists(name); err != nil || got != want {
			t.Errorf("Exists(%s) = %t, %v; want %t", name, got, err, want)
		}
	}

	if ok, err := vfio.IOMMUEnabled(vfio.Dir(t.TempDir())); err != nil || ok {
		t.Errorf("IOMMUEnabled without iommu_groups = %t, %v; want false", ok, err)
	}
}

func TestReadPCIDevice(t *testing.T) {
	t.Run("no IOMMU", func(t *testing.T) {
		fake := node(t, func(b *fakesysfs.Builder) { b.NoIOMMU() })
		got, err := vfio.ReadPCIDevice(fake, audio)
		if err != nil {
			t.Fatal(err)
		}
		want := vfio.PCIDevice{BusID: audio, VendorID: "10de", DeviceID: "22ba", Class: "040300", Driver: "snd_hda_intel"}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("ReadPCIDevice = %+v, want %+v", got, want)
		}
		if ok, err := vfio.IOMMUEnabled(fake); err != nil || ok {
			t.Errorf("IOMMUEnabled = %t, %v; want false", ok, err)
		}
	})
	t.Run("malformed attributes", func(t *testing.T) {
		for attr, content := range map[string]string{"vendor": "10de\n", "device": "0xzz\n", "class": "0x03\n"} {
			root := sysfsTree(t)
			p := filepath.Join(root, "bus/pci/devices", gpu, attr)
			if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := vfio.ReadPCIDevice(vfio.Dir(root), gpu)
			if err == nil || !strings.Contains(err.Error(), "bus/pci/devices/"+gpu+"/"+attr) {
				t.Errorf("ReadPCIDevice with %s = %q: %v, want an error naming the file", attr, content, err)
			}
		}
	})
}

func TestValidBusID(t *testing.T) {
	for id, want := range map[string]bool{
		"0000:1b:00.0": true, "0000:1b:1f.7": true, "10000:e1:00.0": true,
		"0000:1B:00.0": false, "0000:1b:20.0": false, "0000:1b:00.8": false, "1b:00.0": false,
		"0000:1b:00.0/..": false, "": false,
	} {
		if got := vfio.ValidBusID(id); got != want {
			t.Errorf("ValidBusID(%q) = %t, want %t", id, got, want)
		}
	}
}

func TestDeviceNodesOnDir(t *testing.T) {
	rec := vfio.Record{GPU: gpu, IOMMUGroup: gpuGroup, Functions: []vfio.Function{{BusID: gpu, Driver: vfio.VFIOPCI, OriginalDriver: "nvidia"}}}
	for name, tc := range map[string]struct {
		groupDev string
		want     string // error; "" for none
	}{
		"well-formed":   {groupDev: "508:3\n"},
		"no colon":      {groupDev: "508-3\n", want: `class/vfio/27/dev: want "<major>:<minor>", got "508-3"`},
		"trailing junk": {groupDev: "508:3x\n", want: `got "508:3x"`},
		"negative":      {groupDev: "508:-3\n", want: `got "508:-3"`},
	} {
		t.Run(name, func(t *testing.T) {
			root := sysfsTree(t)
			for file, content := range map[string]string{"class/vfio/27/dev": tc.groupDev, "class/misc/vfio/dev": "10:196\n"} {
				p := filepath.Join(root, file)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			got, err := vfio.DeviceNodes(vfio.Dir(root), rec, vfio.NodeOptions{PreferIOMMUFD: true, APIDevice: true})
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("DeviceNodes = %v, want %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// iommufd is there, but the GPU has no vfio-dev: legacy.
			want := vfio.Nodes{Backend: vfio.LegacyBackend, DeviceNodes: []vfio.DeviceNode{
				{Path: "/dev/vfio/vfio", Major: 10, Minor: 196}, {Path: "/dev/vfio/27", Major: 508, Minor: 3},
			}}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("DeviceNodes = %+v, want %+v", got, want)
			}
		})
	}
}
