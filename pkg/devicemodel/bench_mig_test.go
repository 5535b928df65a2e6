package devicemodel_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// benchMIGDriver is the driver name the benchmark's slices carry; its
// length counts in every slice's size.
const benchMIGDriver = "gpu.nvidia.com"

// benchDGXH100 discovers the built-in fleet dgx-h100's node (8x H100 80GB)
// through the simulated NVML, with MIG mode on every GPU or on none.
func benchDGXH100(b *testing.B, migEnabled bool) (string, *hardware.Inventory) {
	b.Helper()
	fleet, err := simfleet.Load("dgx-h100")
	if err != nil {
		b.Fatal(err)
	}
	node := &fleet.Nodes[0]
	if len(node.GPUs) != 8 {
		b.Fatalf("dgx-h100 has %d GPUs, want 8", len(node.GPUs))
	}
	for i := range node.GPUs {
		node.GPUs[i].MIGEnabled = migEnabled // no MIG devices: nothing else depends on it
	}
	inv, err := node.Hardware().Discover(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if len(inv.GPUs) != 8 || len(inv.Problems) > 0 {
		b.Fatalf("discovered %d GPUs with problems %v, want 8 and none", len(inv.GPUs), inv.Problems)
	}
	return node.Name, inv
}

// benchSliceObjects are the ResourceSlices the resourceslice controller
// creates for the pool: its generateName, owner, pool and node, as
// resourceslicecontroller.go builds them.
func benchSliceObjects(nodeName string, slices []resourceslice.Slice) []*resourceapi.ResourceSlice {
	out := make([]*resourceapi.ResourceSlice, len(slices))
	for i, s := range slices {
		out[i] = &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{
				GenerateName: fmt.Sprintf("%x-%s-%s-", i, benchMIGDriver, nodeName),
				OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: nodeName,
					UID: "00000000-0000-0000-0000-000000000000", Controller: ptr.To(true),
				}},
			},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:         benchMIGDriver,
				Pool:           resourceapi.ResourcePool{Name: nodeName, Generation: 1, ResourceSliceCount: int64(len(slices))},
				NodeName:       &nodeName,
				Devices:        s.Devices,
				SharedCounters: s.SharedCounters,
			},
		}
	}
	return out
}

// benchWireSizes encodes the slices as client-go sends them to the API
// server: JSON (the default content type) and protobuf (with the
// Kubernetes envelope), and returns the totals and the largest JSON slice.
func benchWireSizes(b *testing.B, objs []*resourceapi.ResourceSlice) (jsonTotal, protoTotal, jsonMax int) {
	b.Helper()
	jsonCodec := scheme.Codecs.LegacyCodec(resourceapi.SchemeGroupVersion)
	protoCodec := scheme.Codecs.EncoderForVersion(protobuf.NewSerializer(scheme.Scheme, scheme.Scheme), resourceapi.SchemeGroupVersion)
	for _, obj := range objs {
		js, err := runtime.Encode(jsonCodec, obj)
		if err != nil {
			b.Fatal(err)
		}
		if !bytes.Contains(js, []byte(`"kind":"ResourceSlice"`)) {
			b.Fatalf("JSON encoding lacks the kind: %.200s", js)
		}
		pb, err := runtime.Encode(protoCodec, obj)
		if err != nil {
			b.Fatal(err)
		}
		jsonTotal += len(js)
		protoTotal += len(pb)
		jsonMax = max(jsonMax, len(js))
	}
	return jsonTotal, protoTotal, jsonMax
}

// benchPlacements counts the dynamic MIG devices a GPU with MIG mode on
// should give: one per profile and placement start, from the inventory.
func benchPlacements(gpu *hardware.GPU) int {
	n := 0
	for _, p := range gpu.MIGProfiles {
		n += len(p.PlacementStarts)
	}
	return n
}

// BenchmarkDGXH100MIGSlices builds the device model and the ResourceSlices
// of an 8x H100 80GB node, as the plugin does on every discovery: with
// dynamic MIG and MIG mode on every GPU (every profile at every
// placement), with dynamic MIG and MIG mode off (full GPUs consuming their
// counter sets), and without dynamic MIG (full GPUs, no counters). One op
// is Build and Slices; discovery is outside the timer. The metrics are
// the size of what is published: slices, devices, counter sets, and the
// bytes of all slices as client-go encodes them (JSON, the default, and
// protobuf).
func BenchmarkDGXH100MIGSlices(b *testing.B) {
	dynamic := []devicemodel.Option{devicemodel.WithDynamicMIG()}
	for _, tc := range []struct {
		name       string
		migEnabled bool
		opts       []devicemodel.Option
	}{
		{"migOn-dynamic", true, dynamic},
		{"migOff-dynamic", false, dynamic},
		{"migOff-noDynamic", false, nil},
	} {
		b.Run(tc.name, func(b *testing.B) {
			nodeName, inv := benchDGXH100(b, tc.migEnabled)
			var model *devicemodel.Model
			var slices []resourceslice.Slice
			for b.Loop() {
				var err error
				if model, err = devicemodel.Build(inv, tc.opts...); err != nil {
					b.Fatal(err)
				}
				slices = model.Slices()
			}
			b.StopTimer()

			wantDevices, wantSets := len(inv.GPUs), 0
			if tc.opts != nil {
				wantSets = len(inv.GPUs)
			}
			if tc.migEnabled {
				wantDevices = 0
				for i := range inv.GPUs {
					wantDevices += benchPlacements(&inv.GPUs[i])
				}
			}
			if len(model.Devices) != wantDevices || len(model.CounterSets) != wantSets {
				b.Fatalf("model has %d devices and %d counter sets, want %d and %d",
					len(model.Devices), len(model.CounterSets), wantDevices, wantSets)
			}
			seen := map[string]int{}
			sets, migDevices := 0, 0
			for i, s := range slices {
				if len(s.Devices) > 0 && len(s.SharedCounters) > 0 {
					b.Errorf("slice %d holds both devices and counter sets", i)
				}
				if len(s.Devices) > devicemodel.SliceLimit(s.Devices) || len(s.SharedCounters) > resourceapi.ResourceSliceMaxCounterSets {
					b.Errorf("slice %d holds %d devices and %d counter sets, over the API's limits", i, len(s.Devices), len(s.SharedCounters))
				}
				sets += len(s.SharedCounters)
				for _, d := range s.Devices {
					seen[d.Name]++
					if strings.Contains(d.Name, "-mig-") {
						migDevices++
					}
					if (tc.opts != nil) != (len(d.ConsumesCounters) > 0) {
						b.Errorf("device %s consumes %d counter sets with dynamic MIG %v", d.Name, len(d.ConsumesCounters), tc.opts != nil)
					}
				}
			}
			for _, d := range model.Devices {
				if seen[d.Name()] != 1 {
					b.Errorf("device %s is in %d slices, want 1", d.Name(), seen[d.Name()])
				}
			}
			if len(seen) != len(model.Devices) || sets != wantSets {
				b.Fatalf("slices hold %d devices and %d counter sets, want %d and %d", len(seen), sets, len(model.Devices), wantSets)
			}
			if tc.migEnabled != (migDevices == len(model.Devices)) || (!tc.migEnabled && migDevices != 0) {
				b.Fatalf("%d of %d published devices are MIG devices with MIG mode on %v", migDevices, len(model.Devices), tc.migEnabled)
			}

			jsonBytes, protoBytes, jsonMax := benchWireSizes(b, benchSliceObjects(nodeName, slices))
			b.ReportMetric(float64(len(slices)), "slices")
			b.ReportMetric(float64(len(model.Devices)), "devices")
			b.ReportMetric(float64(len(model.CounterSets)), "counter-sets")
			b.ReportMetric(float64(jsonBytes), "json-bytes")
			b.ReportMetric(float64(protoBytes), "proto-bytes")
			b.ReportMetric(float64(jsonMax), "max-slice-json-bytes")
		})
	}
}
