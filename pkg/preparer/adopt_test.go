package preparer_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gpudra/gpudra/pkg/checkpoint"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// gatedNode is fakeNode whose Allocated, which an adoption calls after it
// has listed the claims' specs, waits for the test: each call says so on
// entered and returns once release lets it.
type gatedNode struct {
	fakeNode
	entered chan struct{}
	release chan struct{}
}

func (n gatedNode) Allocated(ctx context.Context) ([]preparer.AllocatedClaim, error) {
	n.entered <- struct{}{}
	select {
	case <-n.release:
		return nil, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// An adoption that waited for another one must not run once that one has
// made the checkpoint usable: it would list a claim's spec, and record the
// claim as adopted after the kubelet unprepared it, keeping its GPU from
// the next claim (seen once in TestDamagedCheckpointNeverGivesAHeldGPUAway,
// where the sweep and a Prepare both found the checkpoint damaged).
func TestAdoptionThatWaitedForAnotherDoesNothing(t *testing.T) {
	r := newRig(t, t.TempDir(), nil)
	if err := r.prepare(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(r.dir, "plugin", "checkpoint.json"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := r.store.Read(context.Background()); !errors.Is(err, checkpoint.ErrNeedsAdoption) {
		t.Fatalf("Read after the damage = %v, want ErrNeedsAdoption", err)
	}
	node := gatedNode{entered: make(chan struct{}, 2), release: make(chan struct{}, 2)}
	confs := []preparer.Configurator{r.confs[0], r.confs[1]}
	prep := preparer.New(preparer.Config{DriverName: driverName, NodeName: nodeName, Store: r.store, CDI: r.cdi, Node: node, Configurators: confs})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	first := make(chan error, 1)
	go func() { first <- prep.AdoptIfNeeded(ctx, nil) }()
	<-node.entered // the first adoption holds the lock, its specs listed
	second := make(chan error, 1)
	go func() { second <- prep.AdoptIfNeeded(ctx, nil) }()
	// Give the second adoption time to wait for the lock; if it gets there
	// only after the first is done, the test still holds (it must then
	// find nothing to do as well).
	time.Sleep(100 * time.Millisecond)
	node.release <- struct{}{}
	if err := <-first; err != nil {
		t.Fatalf("first adoption: %v", err)
	}
	// The claim is adopted; the kubelet unprepares it while the second
	// adoption would be asking the API server.
	if err := r.unprepare(); err != nil {
		t.Fatalf("unprepare of the adopted claim: %v", err)
	}
	node.release <- struct{}{}
	if err := <-second; err != nil {
		t.Fatalf("second adoption: %v", err)
	}
	state, err := r.store.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(state.Claims) != 0 {
		t.Errorf("claims recorded after the unprepare: %v (the waiting adoption recorded a claim that was gone)", state.Claims)
	}
}
