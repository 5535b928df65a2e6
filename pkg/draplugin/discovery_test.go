package draplugin_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpudra/gpudra/pkg/devicemodel"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// lateDriver is hardware whose NVML is unavailable until up is called, as
// on a node where the driver container finishes after the plugin starts.
type lateDriver struct {
	real hardware.Hardware
	mu   sync.Mutex
	isUp bool
	hits int
}

func (l *lateDriver) Discover(ctx context.Context) (*hardware.Inventory, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hits++
	if !l.isUp {
		return nil, fmt.Errorf("libnvidia-ml.so.1 not found under driver root /run/nvidia/driver: %w", hardware.ErrUnavailable)
	}
	return l.real.Discover(ctx)
}

func (l *lateDriver) up() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.isUp = true
}

// publishedDevices counts the devices in the node's ResourceSlices, or -1
// while there is no slice.
func (h *harness) publishedDevices() int {
	list, err := h.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		h.tb.Fatal(err)
	}
	if len(list.Items) == 0 {
		return -1
	}
	n := 0
	for _, s := range list.Items {
		n += len(s.Spec.Devices)
	}
	return n
}

func (h *harness) waitForPublished(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for h.publishedDevices() != want {
		if time.Now().After(deadline) {
			t.Fatalf("published %d devices, want %d", h.publishedDevices(), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestNVMLUnavailableThenLate(t *testing.T) {
	var late *lateDriver
	h := newHarness(t, func(cfg *draplugin.Config) {
		late = &lateDriver{real: cfg.Hardware}
		cfg.Hardware = late
		cfg.DiscoveryInterval = 50 * time.Millisecond
	})
	// An empty pool, not no pool: the driver is up with nothing to offer.
	h.waitForPublished(t, 0)
	events, err := h.waitForEvent("GPUDiscoveryFailed")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(events, "libnvidia-ml.so.1 not found") {
		t.Errorf("event does not say what is missing: %s", events)
	}
	// Prepare before the GPUs are known fails cleanly and can be retried.
	claim := h.claim("gpu-0")
	if r := h.prepare(claim).Claims[string(claim.UID)]; !strings.Contains(r.Error, "not a device of node") {
		t.Errorf("prepare without GPUs: %q", r.Error)
	}

	late.up()
	h.waitForPublished(t, 8)
	h.mustPrepare(claim)
	if _, err := h.waitForEvent("GPUDiscoveryRecovered"); err != nil {
		t.Error(err)
	}
}

// noUVM is hardware on a node where nvidia-uvm was never loaded.
type noUVM struct{ real hardware.Hardware }

func (n noUVM) Discover(ctx context.Context) (*hardware.Inventory, error) {
	inv, err := n.real.Discover(ctx)
	if err == nil {
		inv.Majors.UVM = 0
	}
	return inv, err
}

func TestPrepareWithoutUVMSaysWhatToLoad(t *testing.T) {
	h := newHarness(t, func(cfg *draplugin.Config) { cfg.Hardware = noUVM{cfg.Hardware} })
	claim := h.claim("gpu-0")
	r := h.prepare(claim).Claims[string(claim.UID)]
	if !strings.Contains(r.Error, "nvidia-uvm kernel module is not loaded") || !strings.Contains(r.Error, "modprobe nvidia-uvm") {
		t.Errorf("prepare without nvidia-uvm: %q", r.Error)
	}
	if len(h.specFiles()) != 0 {
		t.Errorf("specs written: %v", h.specFiles())
	}
}

// oneGPULost is hardware whose GPU 3 fell off the bus.
type oneGPULost struct{ real hardware.Hardware }

func (o oneGPULost) Discover(ctx context.Context) (*hardware.Inventory, error) {
	inv, err := o.real.Discover(ctx)
	if err != nil {
		return nil, err
	}
	inv.Problems = append(inv.Problems, hardware.Problem{Index: 3, UUID: inv.GPUs[3].UUID, Err: "GPU 3: nvmlDeviceGetMemoryInfo: ERROR_GPU_IS_LOST"})
	inv.GPUs = append(inv.GPUs[:3:3], inv.GPUs[4:]...)
	return inv, nil
}

func TestLostGPUIsReported(t *testing.T) {
	h := newHarness(t, func(cfg *draplugin.Config) { cfg.Hardware = oneGPULost{cfg.Hardware} })
	h.waitForPublished(t, 7)
	events, err := h.waitForEvent("GPUsLeftOut")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(events, "ERROR_GPU_IS_LOST") {
		t.Errorf("event does not say why: %s", events)
	}
}

// memoryUnanswered is hardware whose GPU 3 does not answer memory info,
// as GB10's unified memory does not.
type memoryUnanswered struct{ real hardware.Hardware }

func (m memoryUnanswered) Discover(ctx context.Context) (*hardware.Inventory, error) {
	inv, err := m.real.Discover(ctx)
	if err != nil {
		return nil, err
	}
	g := &inv.GPUs[3]
	g.MemoryBytes, g.MIGProfiles, g.MIGMemorySlices = 0, nil, 0
	g.Unread = []hardware.Unread{{Property: hardware.PropertyMemory, Query: "nvmlDeviceGetMemoryInfo", Err: "ERROR_NOT_SUPPORTED"}}
	return inv, nil
}

// A GPU with a property discovery could not read is published without it,
// and a Warning Node event names the GPU, the query and its error.
func TestUnreadPropertyIsReported(t *testing.T) {
	h := newHarness(t, func(cfg *draplugin.Config) { cfg.Hardware = memoryUnanswered{cfg.Hardware} })
	h.waitForPublished(t, 8)
	events, err := h.waitForEvent(draplugin.ReasonGPUPropertiesUnread)
	if err != nil {
		t.Fatal(err)
	}
	uuid := h.inventory().GPUs[3].UUID
	want := fmt.Sprintf("1 GPU propert(ies) could not be read; the GPUs are published without them: GPU 3 (%s) memory: nvmlDeviceGetMemoryInfo: ERROR_NOT_SUPPORTED", uuid)
	if events != want {
		t.Errorf("event %q, want %q", events, want)
	}
	if c, ok := h.device("gpu-3").Capacity[devicemodel.CapMemory]; ok {
		t.Errorf("gpu-3 publishes memory %v, which discovery could not read", c.Value)
	}
	if _, ok := h.device("gpu-2").Capacity[devicemodel.CapMemory]; !ok {
		t.Error("gpu-2 lost its memory capacity")
	}
}

// shrinkable is hardware that can lose its last GPU, as when one falls
// off the bus between two discoveries.
type shrinkable struct {
	real hardware.Hardware
	mu   sync.Mutex
	drop bool
}

func (s *shrinkable) Discover(ctx context.Context) (*hardware.Inventory, error) {
	inv, err := s.real.Discover(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil && s.drop {
		inv.GPUs = inv.GPUs[:len(inv.GPUs)-1]
	}
	return inv, err
}

func (s *shrinkable) dropLast() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drop = true
}

// Periodic discoveries that find the hardware and the prepared claims as
// they were build nothing; one that finds a GPU gone republishes, and so
// does one after a claim was prepared (the checkpoint changed).
func TestUnchangedDiscoveryBuildsNothing(t *testing.T) {
	var hw *shrinkable
	h := newHarness(t, func(cfg *draplugin.Config) {
		hw = &shrinkable{real: cfg.Hardware}
		cfg.Hardware = hw
		cfg.DiscoveryInterval = 20 * time.Millisecond
	})
	h.waitForPublished(t, 8)
	waitForUnchanged := func(more int64) {
		t.Helper()
		want := draplugin.UnchangedDiscoveries(h.driver) + more
		deadline := time.Now().Add(20 * time.Second)
		for draplugin.UnchangedDiscoveries(h.driver) < want {
			if time.Now().After(deadline) {
				t.Fatalf("%d unchanged discoveries, want %d", draplugin.UnchangedDiscoveries(h.driver), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitForUnchanged(3)
	h.mustPrepare(h.claim("gpu-0"))
	waitForUnchanged(3)
	hw.dropLast()
	h.waitForPublished(t, 7)
	waitForUnchanged(3)
}
