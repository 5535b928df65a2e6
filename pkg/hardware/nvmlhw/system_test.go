package nvmlhw_test

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/nvmlhw"
)

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// sysfsWithGPU lays out sysfs as the kernel does: the device under its
// root complex in devices/, and a relative symlink in bus/pci/devices.
func sysfsWithGPU(t *testing.T, root, busID, pcieRoot, numa string) {
	t.Helper()
	dev := filepath.Join(root, "devices", pcieRoot, "0000:15:01.0", busID)
	write(t, filepath.Join(dev, "numa_node"), numa+"\n")
	link := filepath.Join(root, "bus", "pci", "devices", busID)
	if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
		t.Fatal(err)
	}
	target, err := filepath.Rel(filepath.Dir(link), dev)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func TestSysfsTopology(t *testing.T) {
	root := t.TempDir()
	sysfsWithGPU(t, root, "0000:1b:00.0", "pci0000:15", "1")
	sysfsWithGPU(t, root, "0000:43:00.0", "pci0000:15", "-1")
	sysfsWithGPU(t, root, "0000:52:00.0", "pci0000:48", "zero")
	// An entry that exists but does not point into devices/pci*.
	write(t, filepath.Join(root, "elsewhere", "0000:61:00.0", "numa_node"), "0\n")
	if err := os.Symlink("../../../elsewhere/0000:61:00.0", filepath.Join(root, "bus", "pci", "devices", "0000:61:00.0")); err != nil {
		t.Fatal(err)
	}
	topo := nvmlhw.NewSysfsTopology(root)

	tests := []struct {
		busID    string
		root     string
		rootErr  bool
		numa     *int
		numaErr  bool
		numaText string
	}{
		{busID: "0000:1b:00.0", root: "pci0000:15", numa: ptr(1)},
		{busID: "0000:43:00.0", root: "pci0000:15"},                // no NUMA affinity
		{busID: "0000:52:00.0", root: "pci0000:48", numaErr: true}, // unparsable numa_node
		{busID: "0000:61:00.0", rootErr: true, numa: ptr(0)},       // not under devices/pci*
		{busID: "0000:9d:00.0"},                                    // no sysfs entry at all
	}
	for _, tt := range tests {
		t.Run(tt.busID, func(t *testing.T) {
			root, err := topo.PCIeRoot(tt.busID)
			if (err != nil) != tt.rootErr || root != tt.root {
				t.Errorf("PCIeRoot: got %q, %v; want %q, error %v", root, err, tt.root, tt.rootErr)
			}
			if err != nil && !strings.Contains(err.Error(), tt.busID) {
				t.Errorf("PCIeRoot error does not name the device: %v", err)
			}
			numa, err := topo.NUMANode(tt.busID)
			if (err != nil) != tt.numaErr || !reflect.DeepEqual(numa, tt.numa) {
				t.Errorf("NUMANode: got %v, %v; want %v, error %v", numa, err, tt.numa, tt.numaErr)
			}
		})
	}
}

func ptr(i int) *int { return &i }

func TestProcSystemInfo(t *testing.T) {
	root := t.TempDir()
	write(t, filepath.Join(root, "devices"), `Character devices:
  1 mem
195 nvidia-frontend
234 nvidia-nvswitch
236 nvidia-caps-imex-channels
237 nvidia-caps
509 nvidia-uvm

Block devices:
  7 loop
259 blkext
`)
	write(t, filepath.Join(root, "driver", "nvidia-caps", "mig-minors"), "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n")
	sys := nvmlhw.NewProcSystemInfo(root)

	majors, err := sys.Majors()
	if err != nil {
		t.Fatal(err)
	}
	if want := (hardware.Majors{NVIDIA: 195, UVM: 509, Caps: 237, IMEXChannels: 236}); majors != want {
		t.Errorf("Majors: got %+v, want %+v", majors, want)
	}
	caps, err := sys.MIGCapMinors()
	if err != nil {
		t.Fatal(err)
	}
	if gi, ok := caps.GI(0, 1); !ok || gi != 12 {
		t.Errorf("GI(0, 1) = %d, %v; want 12", gi, ok)
	}
	if ci, ok := caps.CI(0, 1, 0); !ok || ci != 13 {
		t.Errorf("CI(0, 1, 0) = %d, %v; want 13", ci, ok)
	}
	if _, ok := caps.GI(1, 1); ok {
		t.Error("GI(1, 1) found in a table without it")
	}

	// Without the uvm module, its major is 0.
	write(t, filepath.Join(root, "devices"), "Character devices:\n195 nvidia\n")
	if majors, err := sys.Majors(); err != nil || majors != (hardware.Majors{NVIDIA: 195}) {
		t.Errorf("Majors without modules: got %+v, %v", majors, err)
	}
}

func TestProcSystemInfoErrors(t *testing.T) {
	root := t.TempDir()
	sys := nvmlhw.NewProcSystemInfo(root)
	if _, err := sys.Majors(); err == nil || !strings.Contains(err.Error(), filepath.Join(root, "devices")) {
		t.Errorf("Majors without /proc/devices: got %v", err)
	}
	if _, err := sys.MIGCapMinors(); err == nil || !strings.Contains(err.Error(), "mig-minors") {
		t.Errorf("MIGCapMinors without the file: got %v", err)
	}
	path := filepath.Join(root, "driver", "nvidia-caps", "mig-minors")
	write(t, path, "config 1\ngpu0/gi0/access three\n")
	if _, err := sys.MIGCapMinors(); err == nil || !strings.Contains(err.Error(), path+":2:") {
		t.Errorf("malformed mig-minors: got %v, want an error naming %s:2", err, path)
	}
	write(t, filepath.Join(root, "devices"), "Character devices:\nx nvidia-uvm\n")
	if _, err := sys.Majors(); err == nil || !strings.Contains(err.Error(), ":2:") {
		t.Errorf("malformed /proc/devices: got %v", err)
	}
}

func TestStandardMIGCapMinors(t *testing.T) {
	std := nvmlhw.StandardMIGCapMinors()
	// Lines quoted by the MIG user guide and NVIDIA's DRA driver.
	for name, minor := range map[string]int{
		"config": 1, "monitor": 2,
		"gpu0/gi0/access": 3, "gpu0/gi0/ci0/access": 4, "gpu0/gi0/ci2/access": 6,
		"gpu3/gi3/ci3/access": 439, "gpu6/gi11/ci7/access": 920,
		"gpu31/gi14/ci6/access": 4321, "gpu31/gi14/ci7/access": 4322,
	} {
		if std[name] != minor {
			t.Errorf("%s: got %d, want %d", name, std[name], minor)
		}
	}
	if len(std) != 2+32*15*9 {
		t.Errorf("table has %d entries", len(std))
	}
	// The table survives the file format.
	var lines []string
	for name, minor := range std {
		lines = append(lines, fmt.Sprintf("%s %d", name, minor))
	}
	sort.Strings(lines)
	parsed, err := nvmlhw.ParseMIGCapMinors(strings.NewReader(strings.Join(lines, "\n")), "mig-minors")
	if err != nil || !reflect.DeepEqual(parsed, std) {
		t.Errorf("parsing the standard table back: %v", err)
	}
}
