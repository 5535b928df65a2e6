package vfio_test

import (
	"errors"
	"io/fs"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/vfio"
	"github.com/gpudra/gpudra/pkg/vfio/fakesysfs"
)

func TestPlan(t *testing.T) {
	tests := map[string]struct {
		setup []func(*fakesysfs.Builder)
		opts  []vfio.Option
		gpu   string
		want  vfio.Record
	}{
		"GPU with its audio function": {
			gpu: gpu,
			want: vfio.Record{GPU: gpu, IOMMUGroup: gpuGroup, Functions: []vfio.Function{
				{BusID: gpu, Driver: vfio.VFIOPCI, OriginalDriver: "nvidia"},
				{BusID: audio, Driver: vfio.VFIOPCI, OriginalDriver: "snd_hda_intel"},
			}},
		},
		"Grace: only the GPU gets the variant driver": {
			opts: []vfio.Option{vfio.WithGPUDriver(vfio.NVGraceGPUVFIOPCI)},
			gpu:  gpu,
			want: vfio.Record{GPU: gpu, IOMMUGroup: gpuGroup, Functions: []vfio.Function{
				{BusID: gpu, Driver: vfio.NVGraceGPUVFIOPCI, OriginalDriver: "nvidia"},
				{BusID: audio, Driver: vfio.VFIOPCI, OriginalDriver: "snd_hda_intel"},
			}},
		},
		"unbound function with a driver_override, SR-IOV off, bridge left out": {
			setup: []func(*fakesysfs.Builder){func(b *fakesysfs.Builder) {
				b.Function(fakesysfs.Function{BusID: "0000:3d:00.0", Vendor: "10de", Device: "2330", Class: "030200", IOMMUGroup: 50, DriverOverride: "nvidia", SRIOVVFs: ptr.To(0)})
				b.Function(fakesysfs.Function{BusID: "0000:3c:00.0", Vendor: "1000", Device: "c030", Class: "060400", IOMMUGroup: 50, Driver: "pcieport"})
			}},
			gpu: "0000:3d:00.0",
			want: vfio.Record{GPU: "0000:3d:00.0", IOMMUGroup: 50, Functions: []vfio.Function{
				{BusID: "0000:3d:00.0", Driver: vfio.VFIOPCI, OriginalDriverOverride: "nvidia"},
			}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fake := node(t, tc.setup...)
			got := plan(t, binder(t, fake, tc.opts...), tc.gpu)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Plan =\n%+v\nwant\n%+v", got, tc.want)
			}
			if n := fake.Writes(); n != 0 {
				t.Errorf("Plan wrote %d times", n)
			}
		})
	}
}

func TestPlanRefuses(t *testing.T) {
	tests := map[string]struct {
		setup  func(*fakesysfs.Builder)
		fault  *fakesysfs.Fault
		gpu    string
		want   string
		wantIs error
	}{
		"malformed bus ID": {
			gpu:  "0000:1b:00.0/../..",
			want: `PCI bus ID "0000:1b:00.0/../..": want the lower-case form`,
		},
		"upper-case bus ID": {
			gpu:  "0000:1B:00.0",
			want: `PCI bus ID "0000:1B:00.0"`,
		},
		"unknown device": {
			gpu:    "0000:99:00.0",
			want:   "no PCI device bus/pci/devices/0000:99:00.0 in sysfs",
			wantIs: fs.ErrNotExist,
		},
		"IOMMU off": {
			setup: func(b *fakesysfs.Builder) { b.NoIOMMU() },
			gpu:   gpu,
			want:  "no IOMMU group (bus/pci/devices/0000:1b:00.0/iommu_group is missing): the IOMMU is off",
		},
		"a NIC shares the group": {
			setup: func(b *fakesysfs.Builder) {
				b.Driver(fakesysfs.Driver{Name: "mlx5_core", Loaded: true, Matches: []fakesysfs.Match{{Vendor: "15b3"}}})
				b.Function(fakesysfs.Function{BusID: "0000:1c:00.0", Vendor: "15b3", Device: "101d", Class: "020000", IOMMUGroup: gpuGroup, Driver: "mlx5_core"})
			},
			gpu:  gpu,
			want: "IOMMU group 27 also holds 0000:1c:00.0, which is not a function of the GPU's slot 0000:1b:00",
		},
		"SR-IOV virtual functions enabled": {
			setup: func(b *fakesysfs.Builder) {
				b.Function(fakesysfs.Function{BusID: "0000:3d:00.0", Vendor: "10de", Device: "2330", Class: "030200", IOMMUGroup: 50, Driver: "nvidia", SRIOVVFs: ptr.To(4)})
			},
			gpu:  "0000:3d:00.0",
			want: `function 0000:3d:00.0 has SR-IOV virtual functions enabled (bus/pci/devices/0000:3d:00.0/sriov_numvfs = "4")`,
		},
		"listing the group fails": {
			fault:  &fakesysfs.Fault{Op: fakesysfs.OpReadDir, Path: "kernel/iommu_groups/27/devices", Err: syscall.EIO},
			gpu:    gpu,
			want:   "list IOMMU group 27: open /sys/kernel/iommu_groups/27/devices: input/output error",
			wantIs: syscall.EIO,
		},
		"reading driver_override fails": {
			fault:  &fakesysfs.Fault{Op: fakesysfs.OpRead, Path: "bus/pci/devices/" + audio + "/driver_override", Err: syscall.EIO},
			gpu:    gpu,
			want:   "function 0000:1b:00.1: read driver_override: read /sys/bus/pci/devices/0000:1b:00.1/driver_override",
			wantIs: syscall.EIO,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var setup []func(*fakesysfs.Builder)
			if tc.setup != nil {
				setup = append(setup, tc.setup)
			}
			fake := node(t, setup...)
			if tc.fault != nil {
				fake.InjectFault(*tc.fault)
			}
			rec, err := binder(t, fake).Plan(tc.gpu)
			if err == nil {
				t.Fatalf("Plan = %+v, want an error", rec)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Plan error\n%s\nlacks %q", err, tc.want)
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("Plan error does not wrap %v", tc.wantIs)
			}
		})
	}
}
