package vfio_test

import (
	"context"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/gpudra/gpudra/pkg/vfio"
	"github.com/gpudra/gpudra/pkg/vfio/fakesysfs"
)

func TestDeviceNodes(t *testing.T) {
	const (
		misc  = fakesysfs.MiscMajor
		group = fakesysfs.VFIOGroupMajor
		cdev  = fakesysfs.VFIODevMajor
	)
	vfioAPI := vfio.DeviceNode{Path: "/dev/vfio/vfio", Major: misc, Minor: fakesysfs.VFIOMiscMinor}
	iommuAPI := vfio.DeviceNode{Path: "/dev/iommu", Major: misc, Minor: fakesysfs.IOMMUMiscMinor}
	// The other GPU is bound first, so this group's minor is 1 and its
	// functions' device nodes are vfio1 and vfio2: none of the numbers is
	// the group number or 0 by accident.
	groupNode := vfio.DeviceNode{Path: "/dev/vfio/27", Major: group, Minor: 1}
	gpuNode := vfio.DeviceNode{Path: "/dev/vfio/devices/vfio1", Major: cdev, Minor: 1}
	audioNode := vfio.DeviceNode{Path: "/dev/vfio/devices/vfio2", Major: cdev, Minor: 2}
	withIOMMUFD := func(b *fakesysfs.Builder) { b.IOMMUFD() }

	tests := map[string]struct {
		setup []func(*fakesysfs.Builder)
		opts  vfio.NodeOptions
		want  vfio.Nodes
	}{
		"legacy with API device": {
			opts: vfio.NodeOptions{APIDevice: true},
			want: vfio.Nodes{Backend: vfio.LegacyBackend, DeviceNodes: []vfio.DeviceNode{vfioAPI, groupNode}},
		},
		"legacy without API device": {
			want: vfio.Nodes{Backend: vfio.LegacyBackend, DeviceNodes: []vfio.DeviceNode{groupNode}},
		},
		"legacy though the kernel has iommufd": {
			setup: []func(*fakesysfs.Builder){withIOMMUFD},
			opts:  vfio.NodeOptions{APIDevice: true},
			want:  vfio.Nodes{Backend: vfio.LegacyBackend, DeviceNodes: []vfio.DeviceNode{vfioAPI, groupNode}},
		},
		"iommufd with API device": {
			setup: []func(*fakesysfs.Builder){withIOMMUFD},
			opts:  vfio.NodeOptions{PreferIOMMUFD: true, APIDevice: true},
			want:  vfio.Nodes{Backend: vfio.IOMMUFDBackend, DeviceNodes: []vfio.DeviceNode{iommuAPI, gpuNode, audioNode}},
		},
		"iommufd without API device": {
			setup: []func(*fakesysfs.Builder){withIOMMUFD},
			opts:  vfio.NodeOptions{PreferIOMMUFD: true},
			want:  vfio.Nodes{Backend: vfio.IOMMUFDBackend, DeviceNodes: []vfio.DeviceNode{gpuNode, audioNode}},
		},
		"iommufd preferred, kernel without it: legacy": {
			opts: vfio.NodeOptions{PreferIOMMUFD: true, APIDevice: true},
			want: vfio.Nodes{Backend: vfio.LegacyBackend, DeviceNodes: []vfio.DeviceNode{vfioAPI, groupNode}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fake := node(t, tc.setup...)
			b := binder(t, fake)
			for _, id := range []string{otherGPU, gpu} {
				if err := b.Bind(context.Background(), plan(t, b, id)); err != nil {
					t.Fatalf("Bind %s: %v", id, err)
				}
			}
			got, err := vfio.DeviceNodes(fake, plan(t, b, gpu), tc.opts)
			if err != nil {
				t.Fatalf("DeviceNodes: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("DeviceNodes =\n%+v\nwant\n%+v", got, tc.want)
			}
		})
	}
}

func TestDeviceNodesErrors(t *testing.T) {
	t.Run("group not bound", func(t *testing.T) {
		fake := node(t)
		b := binder(t, fake)
		_, err := vfio.DeviceNodes(fake, plan(t, b, gpu), vfio.NodeOptions{APIDevice: true})
		if want := "VFIO device nodes of IOMMU group 27 (GPU 0000:1b:00.0): device number of /dev/vfio/27: open /sys/class/vfio/27/dev"; err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("DeviceNodes = %v, want %q", err, want)
		}
	})
	t.Run("unreadable device number", func(t *testing.T) {
		fake := node(t, func(b *fakesysfs.Builder) { b.IOMMUFD() })
		b := binder(t, fake)
		rec := plan(t, b, gpu)
		if err := b.Bind(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
		fake.InjectFault(fakesysfs.Fault{Op: fakesysfs.OpRead, Path: "bus/pci/devices/" + audio + "/vfio-dev/vfio1/dev", Err: syscall.EIO})
		_, err := vfio.DeviceNodes(fake, rec, vfio.NodeOptions{PreferIOMMUFD: true})
		if want := "function 0000:1b:00.1: device number of /dev/vfio/devices/vfio1: read /sys/bus/pci/devices/0000:1b:00.1/vfio-dev/vfio1/dev: input/output error"; err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("DeviceNodes = %v, want %q", err, want)
		}
	})
}
