package draplugin_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/hardware"
)

// What the kubelet's DRA manager assumes of a plugin (docs/design/kubelet-plugin.md,
// "What the kubelet assumes of a plugin"), over the plugin's real gRPC
// socket. Assumptions tested elsewhere: idempotent Prepare and Unprepare,
// Unprepare of a claim never seen (TestPrepareUnprepareOverGRPC), claims of
// one call prepared independently (TestConcurrentClaimsForOneDevice).

// countingMIG counts the MIG devices created, and may hold creations until
// their context ends.
type countingMIG struct {
	hardware.MIGManager
	created atomic.Int64
	// block, if set, is called before each creation with its number.
	block func(ctx context.Context, n int64) error
}

func (c *countingMIG) CreateMIGDevice(ctx context.Context, p hardware.MIGPlacement) (hardware.MIGDevice, error) {
	n := c.created.Add(1)
	if c.block != nil {
		if err := c.block(ctx, n); err != nil {
			c.created.Add(-1)
			return hardware.MIGDevice{}, err
		}
	}
	return c.MIGManager.CreateMIGDevice(ctx, p)
}

func withCountingMIG(m **countingMIG) func(*draplugin.Config) {
	return func(cfg *draplugin.Config) {
		*m = &countingMIG{MIGManager: cfg.Hardware.(hardware.MIGManager)}
		cfg.MIG = *m
	}
}

// TestConcurrentPreparesOfOneClaim: the kubelet calls NodePrepareResources
// for one claim from several pod workers at once (pods sharing a claim, both
// finding it not prepared yet), and again while an earlier call it gave up
// on still runs. Every call gets the same CDI devices, and the claim is set
// up once: one MIG device, one spec, one record.
func TestConcurrentPreparesOfOneClaim(t *testing.T) {
	var mig *countingMIG
	h := newMIGHarness(t, withCountingMIG(&mig))
	claim := h.claim(h.migName(0, "1g.10gb", 0))
	const calls = 6
	results := make([][]string, calls)
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			resp, err := h.dra.NodePrepareResources(context.Background(), &drapb.NodePrepareResourcesRequest{Claims: pbClaims(claim)})
			if err != nil {
				t.Errorf("call %d: %v", i, err)
				return
			}
			r := resp.Claims[string(claim.UID)]
			if r == nil || r.Error != "" || len(r.Devices) != 1 {
				t.Errorf("call %d: %+v", i, r)
				return
			}
			results[i] = r.Devices[0].CdiDeviceIds
		})
	}
	wg.Wait()
	for i := 1; i < calls; i++ {
		if !slices.Equal(results[i], results[0]) {
			t.Errorf("call %d answered %v, call 0 %v", i, results[i], results[0])
		}
	}
	if n := mig.created.Load(); n != 1 {
		t.Errorf("%d MIG devices created for one claim, want 1", n)
	}
	if n := len(h.migDevices(0)); n != 1 {
		t.Errorf("%d MIG devices exist, want 1", n)
	}
	if files := h.specFiles(); len(files) != 1 {
		t.Errorf("specs %v, want one", files)
	}
	h.mustUnprepare(claim)
	if n := len(h.migDevices(0)); n != 0 {
		t.Errorf("%d MIG devices left after unprepare", n)
	}
}

// TestKubeletRetriesAfterAClaimFails: a claim's failure is reported for that
// claim, not for the call, and the others of the call are prepared. The
// kubelet then gives up on the whole pod and calls again with every claim:
// the prepared one answers the same, without a write; the failed one fails
// again. The kubelet unprepares every claim it sent, prepared or not.
func TestKubeletRetriesAfterAClaimFails(t *testing.T) {
	h := newHarness(t)
	good, bad := h.claim("gpu-1"), h.claim("gpu-99")
	first := h.prepare(good, bad)
	if r := first.Claims[string(bad.UID)]; r == nil || !strings.Contains(r.Error, "gpu-99") {
		t.Fatalf("bad claim: %+v, want an error naming the device", r)
	}
	prepared := first.Claims[string(good.UID)]
	if prepared == nil || prepared.Error != "" {
		t.Fatalf("good claim in the same call: %+v", prepared)
	}
	writes := h.driver.CheckpointWrites()
	again := h.prepare(good, bad)
	if r := again.Claims[string(good.UID)]; r == nil || r.Error != "" || !slices.Equal(r.Devices[0].CdiDeviceIds, prepared.Devices[0].CdiDeviceIds) {
		t.Errorf("retried good claim: %+v, first %+v", r, prepared)
	}
	if r := again.Claims[string(bad.UID)]; r == nil || r.Error == "" {
		t.Errorf("retried bad claim: %+v, want the error again", r)
	}
	if n := h.driver.CheckpointWrites() - writes; n != 0 {
		t.Errorf("the retry wrote the checkpoint %d times", n)
	}
	resp := h.unprepare(good, bad)
	for _, c := range []string{string(good.UID), string(bad.UID)} {
		if r := resp.Claims[c]; r == nil || r.Error != "" {
			t.Errorf("unprepare %s: %+v", c, r)
		}
	}
	if files := h.specFiles(); len(files) != 0 {
		t.Errorf("specs left: %v", files)
	}
}

// TestPrepareAfterRestartAndReRegistration: the kubelet forgets which
// claims are prepared when it restarts, and finds the plugin again through
// its registration socket when the plugin restarts; either way it asks
// again. The restarted plugin, registered anew on the same endpoint,
// answers from its record: the same CDI devices, nothing set up twice,
// nothing written.
func TestPrepareAfterRestartAndReRegistration(t *testing.T) {
	var mig *countingMIG
	h := newMIGHarness(t, withCountingMIG(&mig))
	claim := h.claim(h.migName(0, "2g.20gb", 0))
	first := h.mustPrepare(claim)
	h.restart()
	if info := getInfo(t, filepath.Join(h.cfg.RegistrarDir, driverName+"-reg.sock")); info.Endpoint != h.draSocket() {
		t.Errorf("re-registered endpoint %s, want %s", info.Endpoint, h.draSocket())
	}
	before := h.checkpoint()
	again := h.mustPrepare(claim)
	if !slices.Equal(again.Devices[0].CdiDeviceIds, first.Devices[0].CdiDeviceIds) {
		t.Errorf("after the restart: %v, before: %v", again.Devices, first.Devices)
	}
	if n := mig.created.Load(); n != 1 {
		t.Errorf("%d MIG devices created, want 1", n)
	}
	if h.checkpoint() != before {
		t.Error("the prepare after the restart rewrote the checkpoint")
	}
	h.mustUnprepare(claim)
}

// TestCancelledPrepareLeavesNoHalfDoneClaim: the kubelet's call ends (its
// 45 s timeout, or the kubelet going away) while the plugin is setting a
// claim up. What was set up is taken down again, no spec is left, and no
// record claims the devices; the kubelet's retry prepares the claim in
// full.
func TestCancelledPrepareLeavesNoHalfDoneClaim(t *testing.T) {
	var mig *countingMIG
	entered := make(chan struct{})
	h := newMIGHarness(t, withCountingMIG(&mig))
	var armed atomic.Bool
	armed.Store(true)
	mig.block = func(ctx context.Context, n int64) error {
		if n != 2 || !armed.CompareAndSwap(true, false) {
			return nil
		}
		close(entered) // the first MIG device exists; the second waits
		<-ctx.Done()
		return context.Cause(ctx)
	}
	claim := h.claim(h.migName(0, "1g.10gb", 0), h.migName(0, "1g.10gb", 1))
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-entered
		cancel()
	}()
	_, err := h.dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: pbClaims(claim)})
	if status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled call = %v, want Canceled", err)
	}
	waitFor(t, func() bool { return len(h.migDevices(0)) == 0 && !strings.Contains(h.checkpoint(), string(claim.UID)) })
	if files := h.specFiles(); len(files) != 0 {
		t.Errorf("specs left by the cancelled call: %v", files)
	}

	resp := h.mustPrepare(claim)
	if len(resp.Devices) != 2 || len(h.migDevices(0)) != 2 {
		t.Errorf("retry: devices %v, MIG devices %d; want 2 each", resp.Devices, len(h.migDevices(0)))
	}
	h.mustUnprepare(claim)
	if n := len(h.migDevices(0)); n != 0 {
		t.Errorf("%d MIG devices left after unprepare", n)
	}
}
