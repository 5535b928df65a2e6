package draplugin_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/gpudra/gpudra/internal/shorttemp"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

// withHealthEvents runs the plugin on a fleet's node whose GPUs take
// injected health events.
func withHealthEvents(tb testing.TB, inject *sim.HealthEvents, fleetNameOrYAML, node string) func(*draplugin.Config) {
	return func(cfg *draplugin.Config) {
		tb.Helper()
		withFleet(tb, fleetNameOrYAML, node)(cfg)
		fleet, err := simfleet.Load(fleetNameOrYAML)
		if err != nil {
			fleet, err = simfleet.Parse([]byte(fleetNameOrYAML), "test")
		}
		if err != nil {
			tb.Fatal(err)
		}
		n, err := fleet.Node(node)
		if err != nil {
			tb.Fatal(err)
		}
		cfg.Hardware = n.Hardware(sim.WithHealthEvents(inject))
	}
}

// healthHarness is a plugin whose GPUs take injected health events.
type healthHarness struct {
	*harness
	inject *sim.HealthEvents
	// sliceWrites counts ResourceSlice creates and updates.
	sliceWrites atomic.Int64
}

func newHealthHarness(t *testing.T, fleetNameOrYAML, node string, gpus int, mutate ...func(*draplugin.Config)) *healthHarness {
	t.Helper()
	h := &healthHarness{inject: &sim.HealthEvents{}}
	client := newFakeClient(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, UID: "node-uid"}})
	client.PrependReactor("*", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if (a.GetVerb() == "create" && !isDryRun(a)) || a.GetVerb() == "update" {
			h.sliceWrites.Add(1)
		}
		return false, nil, nil
	})
	mutate = append([]func(*draplugin.Config){
		withHealthEvents(t, h.inject, fleetNameOrYAML, node),
		func(cfg *draplugin.Config) {
			if cfg.KubeClient == nil {
				cfg.KubeClient = client
			}
		},
	}, mutate...)
	h.harness = newHarnessIn(t, shorttemp.Dir(t), mutate...)
	waitFor(t, func() bool { return h.inject.Watched(h.cfg.NodeName, gpus-1) })
	h.waitPublished(t, "the first publication", func(p map[string]string) bool { return len(p) == len(h.driver.Devices()) })
	return h
}

func (h *healthHarness) do(gpu int, event string) {
	h.tb.Helper()
	e, err := sim.ParseHealthEvent(event)
	if err != nil {
		h.tb.Fatal(err)
	}
	if err := h.inject.Inject(h.cfg.NodeName, gpu, e); err != nil {
		h.tb.Fatal(err)
	}
}

// published returns the taints of every device in the API server's
// ResourceSlices, by device name ("" for a device without taints), as
// "key=value:effect" joined by commas.
func (h *healthHarness) published() map[string]string {
	h.tb.Helper()
	list, err := h.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		h.tb.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			out[d.Name] = taintText(d.Taints)
		}
	}
	return out
}

func taintText(taints []resourceapi.DeviceTaint) string {
	var parts []string
	for _, t := range taints {
		parts = append(parts, fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// tainted returns the devices with taints.
func tainted(published map[string]string) map[string]string {
	out := map[string]string{}
	for name, t := range published {
		if t != "" {
			out[name] = t
		}
	}
	return out
}

// waitPublished waits until cond holds for what the API server has, and
// returns how long that took.
func (h *healthHarness) waitPublished(t *testing.T, what string, cond func(map[string]string) bool) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(10 * time.Second)
	for {
		p := h.published()
		if cond(p) {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not published within 10 s; tainted devices: %v", what, tainted(p))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestHealthTaintsAndRecovery: a fatal XID taints the GPU's device in the
// published slice; an application XID changes nothing; recovery removes
// the taint; a lost GPU stays published with a NoExecute taint until it
// is back. Node events say what happened.
func TestHealthTaintsAndRecovery(t *testing.T) {
	h := newHealthHarness(t, "dgx-h100", nodeName, 8)
	const xid79 = "gpu.nvidia.com/xid=79:NoSchedule"

	h.do(3, "xid:79")
	took := h.waitPublished(t, "xid 79 on GPU 3", func(p map[string]string) bool { return p["gpu-3"] == xid79 })
	t.Logf("fatal XID injected -> taint in the API server's slice: %v", took)
	if got := tainted(h.published()); len(got) != 1 {
		t.Errorf("tainted devices %v, want gpu-3 only", got)
	}
	if msg, err := h.waitForEvent(draplugin.ReasonGPUUnhealthy); err != nil || !strings.Contains(msg, "xid 79") || !strings.Contains(msg, xid79) {
		t.Errorf("Node event: %q, %v", msg, err)
	}

	// What the plugin asks for, not the slice writes: the upstream
	// ResourceSlice controller rewrites a pool's slices on its own schedule
	// after an update (generation bumps, delayed syncs), which once landed
	// in this window under load.
	republished := h.driver.HealthRepublications()
	h.do(4, "xid:13")
	time.Sleep(2 * time.Second) // more than settle + interval
	if got := tainted(h.published()); len(got) != 1 || got["gpu-3"] != xid79 {
		t.Errorf("after an application XID: tainted devices %v, want gpu-3 only", got)
	}
	if r := h.driver.HealthRepublications(); r != republished {
		t.Errorf("an application XID caused %d republications", r-republished)
	}

	metricsText := func() string {
		rec := httptest.NewRecorder()
		h.driver.Metrics().Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return rec.Body.String()
	}
	for _, want := range []string{
		`gpudra_health_events_total{event="xid",ignored="false"} 1`,
		`gpudra_health_events_total{event="xid",ignored="true"} 1`,
		`gpudra_tainted_devices{effect="NoSchedule"} 1`,
	} {
		if m := metricsText(); !strings.Contains(m, want) {
			t.Errorf("metrics lack %s:\n%s", want, grep(m, "gpudra_"))
		}
	}

	h.do(3, "recover")
	took = h.waitPublished(t, "recovery of GPU 3", func(p map[string]string) bool { return len(tainted(p)) == 0 && len(p) == 8 })
	t.Logf("recovery injected -> taint gone from the API server's slice: %v", took)
	if msg, err := h.waitForEvent(draplugin.ReasonGPURecovered); err != nil || !strings.Contains(msg, "gpu-3") {
		t.Errorf("Node event: %q, %v", msg, err)
	}

	h.do(5, "gpu-lost")
	took = h.waitPublished(t, "GPU 5 lost", func(p map[string]string) bool {
		return p["gpu-5"] == "gpu.nvidia.com/gpu-lost=:NoExecute" && len(tainted(p)) == 1
	})
	t.Logf("GPU lost -> NoExecute taint: %v", took)
	// Discovery no longer lists it, and the periodic rediscovery keeps it
	// published, tainted.
	h.waitPublished(t, "GPU 5 kept while lost", func(p map[string]string) bool { return len(p) == 8 })
	if m := metricsText(); !strings.Contains(m, `gpudra_tainted_devices{effect="NoExecute"} 1`) || !strings.Contains(m, `gpudra_tainted_devices{effect="NoSchedule"} 0`) {
		t.Errorf("metrics while GPU 5 is lost:\n%s", grep(m, "tainted"))
	}
	h.do(5, "recover")
	h.waitPublished(t, "GPU 5 back", func(p map[string]string) bool { return len(tainted(p)) == 0 && len(p) == 8 })
}

// TestHealthMIGEventTaintsParentPlacements: an XID from a MIG device is
// taken as GPU-wide: every MIG placement of its parent is tainted, and
// no device of the other GPUs.
func TestHealthMIGEventTaintsParentPlacements(t *testing.T) {
	h := newHealthHarness(t, migFleet, "mig-0", 3)
	before := h.published()
	e := sim.HealthEvent{Kind: sim.InjectXID, XID: 48, MIG: &sim.MIGInstance{GI: 1, CI: 0}}
	if err := h.inject.Inject("mig-0", 1, e); err != nil {
		t.Fatal(err)
	}
	h.waitPublished(t, "xid 48 of a MIG device of GPU 1", func(p map[string]string) bool { return len(tainted(p)) > 0 })
	placements := 0
	for name, taints := range h.published() {
		onGPU1 := strings.HasPrefix(name, "gpu-1-mig-")
		if onGPU1 {
			placements++
		}
		if want := onGPU1; (taints == "gpu.nvidia.com/xid=48:NoSchedule") != want {
			t.Errorf("device %s: taints %q, want tainted %v", name, taints, want)
		}
	}
	if placements < 10 || len(h.published()) != len(before) {
		t.Errorf("%d placements of GPU 1; %d devices published, %d before", placements, len(h.published()), len(before))
	}
	if msg, err := h.waitForEvent(draplugin.ReasonGPUUnhealthy); err != nil || !strings.Contains(msg, "MIG device GI 1, CI 0") {
		t.Errorf("Node event: %q, %v", msg, err)
	}
}

// TestHealthFlappingGPU: a GPU that fails and recovers 100 times in 10 s
// causes a bounded number of republications and slice writes, and the
// published state ends as the GPU does.
func TestHealthFlappingGPU(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 10 s")
	}
	h := newHealthHarness(t, "dgx-h100", nodeName, 8)
	h.waitPublished(t, "start", func(p map[string]string) bool { return len(p) == 8 })
	time.Sleep(time.Second) // the start's own writes are done
	writes, republished := h.sliceWrites.Load(), h.driver.HealthRepublications()
	began := time.Now()
	for i := 0; i < 100; i++ {
		h.do(2, "xid:79")
		time.Sleep(50 * time.Millisecond)
		h.do(2, "recover")
		time.Sleep(50 * time.Millisecond)
	}
	h.do(2, "xid:79")
	h.waitPublished(t, "the last fault", func(p map[string]string) bool { return p["gpu-2"] == "gpu.nvidia.com/xid=79:NoSchedule" })
	time.Sleep(1500 * time.Millisecond)
	elapsed := time.Since(began)
	w, r := h.sliceWrites.Load()-writes, h.driver.HealthRepublications()-republished
	t.Logf("100 flaps in %v (and a last fault): %d republications, %d slice writes", elapsed.Round(time.Millisecond), r, w)
	// At most one republication a second, over however long the flapping
	// took on this machine (10 s when the sleeps are not stretched), plus
	// the first change's and the last's.
	if limit := int(elapsed/time.Second) + 2; r > limit || int(w) > limit {
		t.Errorf("%d republications, %d slice writes for 100 flaps in %v; want at most %d (one a second)", r, w, elapsed, limit)
	}
}

// dropTaints makes the fake API server behave like one without device
// taints: it stores ResourceSlices without them.
func dropTaints(client *fake.Clientset) {
	var n atomic.Int64
	strip := func(obj runtime.Object) *resourceapi.ResourceSlice {
		s := obj.(*resourceapi.ResourceSlice).DeepCopy()
		for i := range s.Spec.Devices {
			s.Spec.Devices[i].Taints = nil
		}
		if s.Name == "" {
			s.Name = fmt.Sprintf("%s%05d", s.GenerateName, n.Add(1))
		}
		return s
	}
	client.PrependReactor("create", "resourceslices", func(action k8stesting.Action) (bool, runtime.Object, error) {
		a := action.(k8stesting.CreateAction)
		s := strip(a.GetObject())
		if isDryRun(action) {
			return true, s, nil
		}
		return true, s, client.Tracker().Create(a.GetResource(), s, "")
	})
	client.PrependReactor("update", "resourceslices", func(action k8stesting.Action) (bool, runtime.Object, error) {
		a := action.(k8stesting.UpdateAction)
		s := strip(a.GetObject())
		return true, s, client.Tracker().Update(a.GetResource(), s, "")
	})
}

// newHealthHarnessWithoutTaints is a health harness whose API server
// drops device taints.
func newHealthHarnessWithoutTaints(t *testing.T) *healthHarness {
	client := newFakeClient(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName, UID: "node-uid"}})
	dropTaints(client)
	return newHealthHarness(t, "dgx-h100", nodeName, 8, func(cfg *draplugin.Config) {
		cfg.KubeClient = client
		cfg.HealthReportInterval = 200 * time.Millisecond
	})
}

// withdrawGPU6 makes GPU 6 unhealthy and waits until the plugin withdrew
// it, having said why.
func withdrawGPU6(t *testing.T, h *healthHarness) {
	t.Helper()
	h.do(6, "xid:79")
	if _, err := h.waitForEvent("DeviceTaintsUnavailable"); err != nil {
		t.Fatal(err)
	}
	h.waitPublished(t, "GPU 6 withdrawn", func(p map[string]string) bool {
		_, ok := p["gpu-6"]
		return !ok && len(p) == 7
	})
}

// TestHealthOfWithdrawnGPUOnALaterStream: a health stream the kubelet
// opens only after a GPU was withdrawn (a kubelet restart) hears in its
// first report that the GPU's device is unhealthy, though no stream ever
// saw it published.
func TestHealthOfWithdrawnGPUOnALaterStream(t *testing.T) {
	h := newHealthHarnessWithoutTaints(t)
	withdrawGPU6(t, h)
	stream := watchHealth(t, h.harness)
	if bad := unhealthy(byDevice(stream.next(5 * time.Second))); len(bad) != 1 || !strings.Contains(bad["gpu-6"], "UNHEALTHY: GPU ") {
		t.Errorf("first report of a stream opened after the withdrawal: %v, want gpu-6 UNHEALTHY only", bad)
	}
}

// TestHealthWithoutDeviceTaints: where the API server drops device taints,
// the plugin says so once and withdraws the unhealthy GPU instead, until it
// recovers; the kubelet keeps hearing the withdrawn GPU's devices are
// unhealthy.
func TestHealthWithoutDeviceTaints(t *testing.T) {
	h := newHealthHarnessWithoutTaints(t)
	stream := watchHealth(t, h.harness)
	withdrawGPU6(t, h)
	if _, err := h.waitForEvent("UnhealthyGPUsWithdrawn"); err != nil {
		t.Error(err)
	}
	// Pods may still hold the withdrawn device: the kubelet keeps
	// hearing it is unhealthy, in the reports after the withdrawal too.
	if len(h.driver.Devices()) != 7 {
		t.Fatalf("the plugin publishes %d devices, want 7 without gpu-6", len(h.driver.Devices()))
	}
	// Reports queued on the stream may be older than the xid (the stream
	// is read only from here on; under load it lags): skip to the first
	// that has it, then every later one must keep it.
	stream.drain()
	stream.waitFor("gpu-6 reported unhealthy", func(m map[string]*drahealthv1.DeviceHealth) bool {
		bad := unhealthy(m)
		return len(bad) == 1 && strings.Contains(bad["gpu-6"], "UNHEALTHY: GPU ")
	})
	for range 2 {
		if bad := unhealthy(byDevice(stream.next(5 * time.Second))); len(bad) != 1 || !strings.Contains(bad["gpu-6"], "UNHEALTHY: GPU ") {
			t.Errorf("report while gpu-6 is withdrawn: %v, want gpu-6 UNHEALTHY only", bad)
		}
	}
	h.do(6, "recover")
	h.waitPublished(t, "GPU 6 back", func(p map[string]string) bool { return len(p) == 8 })
	stream.waitFor("gpu-6 healthy again", func(m map[string]*drahealthv1.DeviceHealth) bool {
		return len(m) == 8 && len(unhealthy(m)) == 0
	})
}
