package devicehealth_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/features/devicehealth"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/health"
	"github.com/gpudra/gpudra/pkg/preparer"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

func TestPublish(t *testing.T) {
	f, err := simfleet.Load("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	inv, err := f.Nodes[0].Hardware().Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	gpu := func(i int) string { return inv.GPUs[i].UUID }
	event := func(uuid string, kind hardware.HealthEventKind, xid uint64) hardware.HealthEvent {
		return hardware.HealthEvent{GPUUUID: uuid, Kind: kind, XID: xid, GIID: hardware.NoInstance, CIID: hardware.NoInstance, Time: time.Now()}
	}
	p, err := devicehealth.New("gpu.nvidia.com", health.DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	var s *health.State
	s, _ = s.Apply(p.Policy(), event(gpu(1), hardware.HealthXID, 79))
	s, _ = s.Apply(p.Policy(), event(gpu(2), hardware.HealthGPULost, 0))
	p.SetState(s)

	// GPU 2 is lost: discovery no longer lists it.
	lostInv := *inv
	lostInv.GPUs = slices.DeleteFunc(slices.Clone(inv.GPUs), func(g hardware.GPU) bool { return g.UUID == gpu(2) })
	pub, err := preparer.Publish(nil, &lostInv, inv, nil, []preparer.Publisher{p})
	if err != nil {
		t.Fatal(err)
	}
	taints := map[string]string{}
	for _, d := range pub.Model.Devices {
		for _, tt := range d.API.Taints {
			taints[d.Name()] += tt.Key + "=" + tt.Value + ":" + string(tt.Effect)
		}
	}
	want := map[string]string{"gpu-1": "gpu.nvidia.com/xid=79:NoSchedule", "gpu-2": "gpu.nvidia.com/gpu-lost=:NoExecute"}
	if len(taints) != len(want) || taints["gpu-1"] != want["gpu-1"] || taints["gpu-2"] != want["gpu-2"] {
		t.Errorf("taints %v, want %v (the lost GPU kept from the previous publication)", taints, want)
	}

	// Without device taints in the API server: both are withdrawn.
	for _, fb := range p.Fallbacks() {
		if fb.Feature != "DRADeviceTaints" {
			t.Fatalf("fallback for %s", fb.Feature)
		}
		fb.On.Store(false)
	}
	pub, err = preparer.Publish(nil, &lostInv, inv, nil, []preparer.Publisher{p})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range pub.Model.Devices {
		if d.Name() == "gpu-1" || d.Name() == "gpu-2" || len(d.API.Taints) > 0 {
			t.Errorf("device %s published (taints %v) without device taints in the API server", d.Name(), d.API.Taints)
		}
	}
	if len(pub.Model.Devices) != 6 || len(pub.Notices) != 1 || !strings.Contains(pub.Notices[0].Message, "xid 79") {
		t.Errorf("%d devices, notices %+v; want 6 and one notice naming the withdrawn GPU", len(pub.Model.Devices), pub.Notices)
	}
}
