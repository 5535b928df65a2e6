package vfio_test

import (
	"testing"

	"github.com/gpudra/gpudra/pkg/vfio"
	"github.com/gpudra/gpudra/pkg/vfio/fakesysfs"
)

// TestGPUs lists NVIDIA's display functions, whatever their driver, and
// leaves out the audio function of the same card.
func TestGPUs(t *testing.T) {
	fake := node(t, func(b *fakesysfs.Builder) {
		b.Function(fakesysfs.Function{BusID: "0000:05:00.0", Vendor: "8086", Device: "1234", Class: "030000", IOMMUGroup: 5})
		b.Function(fakesysfs.Function{BusID: "0000:3d:00.0", Vendor: fakesysfs.NVIDIAVendor, Device: fakesysfs.H100SXMDevice, Class: "030200", IOMMUGroup: 41})
	})
	gpus, err := vfio.GPUs(fake)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range gpus {
		got = append(got, g.BusID+"="+g.Driver)
	}
	want := []string{gpu + "=nvidia", otherGPU + "=nvidia", "0000:3d:00.0="}
	if len(got) != len(want) {
		t.Fatalf("GPUs %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("GPU %d: %s, want %s", i, got[i], want[i])
		}
	}
}

// TestDetectGPUDriver: a Grace system's GPU (GH200, GB200: the device IDs
// nvgrace-gpu-vfio-pci claims) picks that driver; any other node vfio-pci.
func TestDetectGPUDriver(t *testing.T) {
	for _, tc := range []struct {
		name   string
		device string
		want   string
	}{
		{"H100 node", "", vfio.VFIOPCI},
		{"GH200 480GB", "2342", vfio.NVGraceGPUVFIOPCI},
		{"GB200", "2941", vfio.NVGraceGPUVFIOPCI},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := node(t, func(b *fakesysfs.Builder) {
				if tc.device != "" {
					b.Function(fakesysfs.Function{BusID: "0009:01:00.0", Vendor: fakesysfs.NVIDIAVendor, Device: tc.device, Class: "030200", IOMMUGroup: 9, Driver: "nvidia"})
				}
			})
			got, err := vfio.DetectGPUDriver(fake)
			if err != nil || got != tc.want {
				t.Errorf("DetectGPUDriver = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	empty, err := fakesysfs.NewBuilder().Build()
	if err != nil {
		t.Fatal(err)
	}
	if got, err := vfio.DetectGPUDriver(empty); err != nil || got != vfio.VFIOPCI {
		t.Errorf("no GPU: %q, %v; want vfio-pci", got, err)
	}
}
