package draplugin_test

import (
	"strings"
	"testing"
)

// Two 1g.10gb+me MIG devices of one GPU do not overlap in memory slices,
// but both need the GPU's one optical flow engine. When the scheduler hands
// out the second while the first is still prepared (its pod deleted by
// force), the node refuses it, naming the holder and the counter, and
// prepares it once the first is gone (chaos seed 636).
func TestMIGDevicesThatShareAnEngineAreRefused(t *testing.T) {
	h := newMIGHarness(t)
	var me []string
	prefix := strings.TrimSuffix(h.migName(0, "1g.10gb+me", 0), "0")
	for _, d := range h.driver.Devices() {
		if strings.HasPrefix(d.Name, prefix) && len(me) < 2 {
			me = append(me, d.Name)
		}
	}
	if len(me) < 2 {
		t.Fatalf("want two 1g.10gb+me placements on GPU 0, have %v", me)
	}
	first := h.claim(me[0])
	h.mustPrepare(first)
	second := h.claim(me[1])
	msg := prepareError(h, second)
	for _, want := range []string{me[1], "ofa", first.Name, string(first.UID)} {
		if !strings.Contains(msg, want) {
			t.Errorf("Prepare of %s beside %s: %q does not name %q", me[1], me[0], msg, want)
		}
	}
	if n := len(h.migDevices(0)); n != 1 {
		t.Errorf("%d MIG devices on GPU 0, want the first claim's only", n)
	}
	h.mustUnprepare(first)
	h.mustPrepare(second)
}
