package deviceplugin_test

import (
	"context"
	"fmt"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpudra/gpudra/pkg/deviceplugin"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// BenchmarkPreferred is GetPreferredAllocation's choice alone, on a DGX
// H100's eight GPUs and on the 64 replicas of its GPUs time-sliced 8 ways.
func BenchmarkPreferred(b *testing.B) {
	for _, tc := range []struct {
		name     string
		replicas int
		size     int
	}{{"gpus-2of8", 0, 2}, {"gpus-4of8", 0, 4}, {"replicas-4of64", 8, 4}} {
		b.Run(tc.name, func(b *testing.B) {
			opts := deviceplugin.PlanOptions{}
			if tc.replicas > 0 {
				opts.TimeSlicing.Resources = []deviceplugin.ReplicaResource{{Name: deviceplugin.ResourceGPU, Replicas: tc.replicas}}
			}
			rs, err := deviceplugin.Plan(benchInventory(b), opts)
			if err != nil {
				b.Fatal(err)
			}
			r := &rs[0]
			var ids []string
			for _, d := range r.Devices {
				ids = append(ids, d.ID)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.Preferred(ids, nil, tc.size); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAllocateGRPC is one container's Allocate of one or eight GPUs
// over the plugin's unix socket, as the kubelet calls it.
func BenchmarkAllocateGRPC(b *testing.B) {
	for _, n := range []int{1, 8} {
		b.Run(fmt.Sprintf("gpus-%d", n), func(b *testing.B) {
			r := newRig(b, "dgx-h100", "dgx-h100-0", deviceplugin.Options{})
			c := r.client(b, deviceplugin.ResourceGPU)
			var ids []string
			for _, d := range r.plugin.Resources()[0].Devices[:n] {
				ids = append(ids, d.ID)
			}
			req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Allocate(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func benchInventory(b *testing.B) *hardware.Inventory {
	b.Helper()
	f, err := simfleet.Load("dgx-h100")
	if err != nil {
		b.Fatal(err)
	}
	inv, err := f.Nodes[0].Hardware().Discover(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	return inv
}
