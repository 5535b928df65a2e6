package imexchannel_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// recordingDaemon is a fake imexchannel.Daemon that records its calls and
// is ready unless notReady is set.
type recordingDaemon struct {
	mu       sync.Mutex
	calls    []string
	notReady error
}

func (d *recordingDaemon) Hold(_ context.Context, claim, domain, clique string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, "hold "+claim+" "+domain+" "+clique)
	return nil
}

func (d *recordingDaemon) Release(_ context.Context, claim string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, "release "+claim)
	return nil
}

func (d *recordingDaemon) WaitReady(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, "wait")
	return d.notReady
}

func (d *recordingDaemon) taken() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.calls
	d.calls = nil
	return out
}

// TestPrepareHoldsAndWaitsForDaemon: a channel claim holds the node's IMEX
// daemon (with the node's clique) and Prepare waits for it; a daemon that
// is not ready fails Prepare with its reason and drops the hold; Unprepare
// drops it; a restart holds it again for every prepared claim.
func TestPrepareHoldsAndWaitsForDaemon(t *testing.T) {
	ctx := context.Background()
	d := &recordingDaemon{}
	h := newDaemonHarness(t, domains{"dom-a": {"team-a", 1}}, d)
	clique, err := newFakeNode(t).inv.CliqueID()
	if err != nil {
		t.Fatal(err)
	}

	if _, err := h.prep.Prepare(ctx, channelClaim("a1", "team-a", channelConfig("dom-a", ""))); err != nil {
		t.Fatal(err)
	}
	if got, want := d.taken(), []string{"hold a1 dom-a " + clique, "wait"}; !slices.Equal(got, want) {
		t.Errorf("prepare: calls %q, want %q", got, want)
	}

	d.notReady = errors.New("the node's IMEX daemon is not ready after 40s: last nvidia-imex-ctl -q printed \"NOT_READY\"")
	_, err = h.prep.Prepare(ctx, channelClaim("a2", "team-a", channelConfig("dom-a", "")))
	if err == nil || !strings.Contains(err.Error(), "domainID dom-a") || !strings.Contains(err.Error(), "NOT_READY") {
		t.Fatalf("prepare with the daemon not ready: %v", err)
	}
	if got, want := d.taken(), []string{"hold a2 dom-a " + clique, "wait", "release a2"}; !slices.Equal(got, want) {
		t.Errorf("failed prepare: calls %q, want %q", got, want)
	}

	if err := h.prep.Restore(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := d.taken(), []string{"hold a1 dom-a " + clique}; !slices.Equal(got, want) {
		t.Errorf("restore: calls %q, want %q", got, want)
	}
	if _, err := h.prep.Unprepare(ctx, kubeletplugin.NamespacedObject{UID: types.UID("a1")}); err != nil {
		t.Fatal(err)
	}
	if got, want := d.taken(), []string{"release a1"}; !slices.Equal(got, want) {
		t.Errorf("unprepare: calls %q, want %q", got, want)
	}
}
