package sim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/hardware"
)

func TestParseHealthEvent(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    HealthEvent
		wantErr string
	}{
		{in: "xid:79", want: HealthEvent{Kind: InjectXID, XID: 79}},
		{in: "ecc-dbe", want: HealthEvent{Kind: InjectECCDBE}},
		{in: "gpu-lost", want: HealthEvent{Kind: InjectGPULost}},
		{in: "recover", want: HealthEvent{Kind: InjectRecover}},
		{in: "xid:", wantErr: "positive number"},
		{in: "xid:0", wantErr: "positive number"},
		{in: "xid:-3", wantErr: "positive number"},
		{in: "reboot", wantErr: "xid:<n>, ecc-dbe, gpu-lost, recover"},
	} {
		got, err := ParseHealthEvent(tc.in)
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: got %v, want an error with %q", tc.in, err, tc.wantErr)
		case tc.wantErr == "" && (err != nil || got.Kind != tc.want.Kind || got.XID != tc.want.XID):
			t.Errorf("%q: got %+v, %v; want %+v", tc.in, got, err, tc.want)
		case err == nil && got.String() != tc.in:
			t.Errorf("%q renders as %q", tc.in, got.String())
		}
	}
}

// healthRig runs nvmlhw's real health watcher over a simulated node.
type healthRig struct {
	node   *Node
	hw     hardware.Hardware
	inject *HealthEvents
	events chan hardware.HealthEvent
	uuids  []string
}

func newHealthRig(t *testing.T, fleet string) *healthRig {
	t.Helper()
	f, err := loadFleet(fleet)
	if err != nil {
		t.Fatal(err)
	}
	r := &healthRig{node: &f.Nodes[0], inject: &HealthEvents{}, events: make(chan hardware.HealthEvent, 16)}
	r.hw = r.node.Hardware(WithHealthEvents(r.inject))
	inv, err := r.hw.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range inv.GPUs {
		r.uuids = append(r.uuids, g.UUID)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.hw.(hardware.HealthWatcher).WatchHealth(ctx, r.events) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchHealth: %v", err)
		}
	})
	// An injection before the watcher registered the GPUs is not seen.
	deadline := time.Now().Add(5 * time.Second)
	for !r.inject.Watched(r.node.Name, len(r.uuids)-1) {
		if time.Now().After(deadline) {
			t.Fatal("the watcher did not register the GPUs within 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return r
}

func (r *healthRig) do(t *testing.T, gpu int, e HealthEvent) {
	t.Helper()
	if err := r.inject.Inject(r.node.Name, gpu, e); err != nil {
		t.Fatal(err)
	}
}

func (r *healthRig) next(t *testing.T) hardware.HealthEvent {
	t.Helper()
	select {
	case e := <-r.events:
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no health event within 5 s")
	}
	return hardware.HealthEvent{}
}

// The injected events reach nvmlhw's watcher as the health events NVML
// would give, within a wait of the event set.
func TestInjectedHealthEvents(t *testing.T) {
	r := newHealthRig(t, "dgx-h100")
	start := time.Now()
	r.do(t, 3, HealthEvent{Kind: InjectXID, XID: 79})
	e := r.next(t)
	if e.Kind != hardware.HealthXID || e.XID != 79 || e.GPUUUID != r.uuids[3] || e.MIG() {
		t.Errorf("got %+v, want xid 79 of GPU 3 (%s)", e, r.uuids[3])
	}
	t.Logf("injected XID seen by the watcher after %v", time.Since(start))

	r.do(t, 2, HealthEvent{Kind: InjectECCDBE})
	if e := r.next(t); e.Kind != hardware.HealthECCDoubleBit || e.GPUUUID != r.uuids[2] {
		t.Errorf("got %+v, want ECC of GPU 2", e)
	}
	r.do(t, 3, HealthEvent{Kind: InjectRecover})
	if e := r.next(t); e.Kind != hardware.HealthRecovered || e.GPUUUID != r.uuids[3] {
		t.Errorf("got %+v, want GPU 3 recovered", e)
	}

	r.do(t, 5, HealthEvent{Kind: InjectGPULost})
	if e := r.next(t); e.Kind != hardware.HealthGPULost || e.GPUUUID != r.uuids[5] {
		t.Errorf("got %+v, want GPU 5 lost", e)
	}
	inv, err := r.hw.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(inv.GPUs) != 7 || len(inv.Problems) != 1 || !strings.Contains(inv.Problems[0].Err, "GPU_IS_LOST") {
		t.Errorf("discovery of a lost GPU: %d GPUs, problems %+v; want GPU 5 left out as lost", len(inv.GPUs), inv.Problems)
	}
	// Hardware made again (a restarted plugin) finds the GPU still lost.
	if inv, err := r.node.Hardware(WithHealthEvents(r.inject)).Discover(context.Background()); err != nil || len(inv.GPUs) != 7 {
		t.Errorf("new hardware: %v, %d GPUs; want the lost GPU still left out", err, len(inv.GPUs))
	}
	if err := r.inject.Inject(r.node.Name, 5, HealthEvent{Kind: InjectXID, XID: 48}); err == nil {
		t.Error("an XID of a lost GPU was accepted")
	}
	r.do(t, 5, HealthEvent{Kind: InjectRecover})
	if e := r.next(t); e.Kind != hardware.HealthRecovered || e.GPUUUID != r.uuids[5] {
		t.Errorf("got %+v, want GPU 5 recovered", e)
	}
	if inv, err := r.hw.Discover(context.Background()); err != nil || len(inv.GPUs) != 8 {
		t.Errorf("after recovery: %v, %d GPUs; want 8", err, len(inv.GPUs))
	}
	// ECC of GPU 2 is still unrecovered: its recovery action asks for a
	// reset, so polling gives nothing more.
	select {
	case e := <-r.events:
		t.Errorf("unexpected event %+v", e)
	case <-time.After(2 * HealthPollInterval):
	}
}

// An XID of a MIG device carries its GPU and compute instance IDs, and the
// parent's UUID.
func TestInjectedMIGEvent(t *testing.T) {
	r := newHealthRig(t, "dgx-a100-mig")
	r.do(t, 0, HealthEvent{Kind: InjectXID, XID: 43, MIG: &MIGInstance{GI: 1, CI: 0}})
	if e := r.next(t); e.Kind != hardware.HealthXID || e.XID != 43 || e.GPUUUID != r.uuids[0] || e.GIID != 1 || e.CIID != 0 {
		t.Errorf("got %+v, want xid 43 of GI 1, CI 0 on GPU 0", e)
	}
}

func TestInjectRefusals(t *testing.T) {
	f, err := loadFleet("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	h := &HealthEvents{}
	n := f.Nodes[0]
	if err := h.Inject(n.Name, 0, HealthEvent{Kind: InjectGPULost}); err == nil || !strings.Contains(err.Error(), "no simulated hardware") {
		t.Errorf("before any hardware: got %v", err)
	}
	n.Hardware(WithHealthEvents(h))
	for _, tc := range []struct {
		gpu  int
		e    HealthEvent
		want string
	}{
		{8, HealthEvent{Kind: InjectGPULost}, "GPUs 0 to 7"},
		{0, HealthEvent{Kind: InjectGPULost, MIG: &MIGInstance{}}, "MIG device"},
		{0, HealthEvent{Kind: "reboot"}, "must be one of"},
	} {
		if err := h.Inject(n.Name, tc.gpu, tc.e); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("inject %v on %d: got %v, want %q", tc.e, tc.gpu, err, tc.want)
		}
	}
	// Nobody watches: the XID is not seen, and the caller hears so.
	if err := h.Inject(n.Name, 0, HealthEvent{Kind: InjectXID, XID: 79}); !errors.Is(err, ErrNotWatched) {
		t.Errorf("unwatched XID: got %v, want ErrNotWatched", err)
	}
}

// TestCheckHealth reads the GPUs' conditions once, as inspect does,
// through nvmlhw's real code over the simulated NVML: a GPU after an XID
// needs a reset, a lost GPU is lost, and both are fine after recovery.
func TestCheckHealth(t *testing.T) {
	f, err := loadFleet("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	n := f.Nodes[0]
	h := &HealthEvents{}
	hw := n.Hardware(WithHealthEvents(h))
	checker, ok := hw.(hardware.HealthChecker)
	if !ok {
		t.Fatal("simulated hardware does not check health")
	}
	check := func() []string {
		t.Helper()
		conds, err := checker.CheckHealth(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		out := make([]string, len(conds))
		for i, c := range conds {
			if c.Index != i {
				t.Errorf("condition %d has index %d", i, c.Index)
			}
			if c.Lost != (c.UUID == "") {
				t.Errorf("GPU %d: lost %v with UUID %q", i, c.Lost, c.UUID)
			}
			out[i] = c.String()
		}
		return out
	}
	if got := strings.Join(check(), " "); got != "ok ok ok ok ok ok ok ok" {
		t.Errorf("healthy node: got %s", got)
	}
	// Nobody watches, so the XID is not delivered; the GPU's condition
	// changes all the same, as on a real GPU.
	if err := h.Inject(n.Name, 2, HealthEvent{Kind: InjectXID, XID: 79}); !errors.Is(err, ErrNotWatched) {
		t.Fatal(err)
	}
	if err := h.Inject(n.Name, 5, HealthEvent{Kind: InjectGPULost}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(check(), " "); got != "ok ok needs gpu-reset ok ok lost ok ok" {
		t.Errorf("after an XID on GPU 2 and GPU 5 lost: got %s", got)
	}
	for _, gpu := range []int{2, 5} {
		if err := h.Inject(n.Name, gpu, HealthEvent{Kind: InjectRecover}); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Join(check(), " "); got != "ok ok ok ok ok ok ok ok" {
		t.Errorf("after recovery: got %s", got)
	}
}

// An idle watcher over simulated GPUs blocks on its event set as on
// NVML's, without a poll: a fleet of a thousand simulated nodes in one
// process pays every wake-up. It still stops at once (its wait is
// interrupted when its context ends), and an injected event still wakes
// it.
func TestIdleWatcherDoesNoPeriodicWork(t *testing.T) {
	f, err := loadFleet("dgx-h100")
	if err != nil {
		t.Fatal(err)
	}
	faults := &Faults{}
	inject := &HealthEvents{}
	node := f.Nodes[0]
	hw := node.Hardware(WithFaults(faults), WithHealthEvents(inject))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	events := make(chan hardware.HealthEvent, 64)
	go func() { done <- hw.(hardware.HealthWatcher).WatchHealth(ctx, events) }()
	deadline := time.Now().Add(5 * time.Second)
	for !inject.Watched(node.Name, 7) {
		if time.Now().After(deadline) {
			t.Fatal("the watcher did not register the GPUs within 5 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	waits, counts := faults.Calls("nvmlEventSetWait"), faults.Calls("nvmlDeviceGetCount")
	time.Sleep(2 * HealthPollInterval)
	// At most the wait in progress: polling would have added one wait
	// and one enumeration per poll interval.
	if w, c := faults.Calls("nvmlEventSetWait")-waits, faults.Calls("nvmlDeviceGetCount")-counts; w > 1 || c > 0 {
		t.Errorf("idle for two poll intervals: %d more event-set waits, %d more enumerations; want at most 1 and 0", w, c)
	}
	if err := inject.Inject(node.Name, 1, HealthEvent{Kind: InjectXID, XID: 79}); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-events:
		if e.Kind != hardware.HealthXID || e.XID != 79 {
			t.Errorf("got %+v, want xid 79", e)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the idle watcher did not wake for an injected XID within 5 s")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("WatchHealth: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("WatchHealth still waiting a minute after its context ended")
	}
}
