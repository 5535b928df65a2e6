package draplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// reportNotices logs what the features left out at every publication, and
// records a Node event when it changes. A problem is an error and a Warning
// event; an expected absence ([preparer.Notice].Expected) is an Info line
// when it appears, a V(2) line while it lasts, and a Normal event.
func (e *events) reportNotices(ctx context.Context, before, now []preparer.Notice) {
	logger := klog.FromContext(ctx)
	if len(now) == 0 && len(before) > 0 {
		logger.Info("Devices left out by an earlier publication are back", "reasons", len(before))
	}
	for _, n := range now {
		changed := !slices.Contains(before, n)
		switch {
		case !n.Expected:
			logger.Error(nil, "Devices left out of or changed in the publication", "reason", n.Reason, "detail", n.Message)
		case changed:
			logger.Info("Devices not published on this node, as expected of its hardware", "reason", n.Reason, "detail", n.Message)
		default:
			logger.V(2).Info("Devices not published on this node, as expected of its hardware", "reason", n.Reason, "detail", n.Message)
		}
		if !changed {
			continue
		}
		if n.Expected {
			e.node(corev1.EventTypeNormal, n.Reason, n.Message)
		} else {
			e.node(corev1.EventTypeWarning, n.Reason, n.Message)
		}
	}
}

// reportProblems logs the GPUs and MIG devices discovery left out, and
// records a Node event when that set changes: an operator should learn that
// a GPU is missing, not find it by counting devices.
func (e *events) reportProblems(ctx context.Context, previous, inv *hardware.Inventory) {
	var before []hardware.Problem
	if previous != nil {
		before = previous.Problems
	}
	if len(inv.Problems) == 0 {
		if len(before) > 0 {
			klog.FromContext(ctx).Info("GPUs left out by an earlier discovery are back", "problemsBefore", len(before))
		}
		return
	}
	logger := klog.FromContext(ctx)
	for _, p := range inv.Problems {
		logger.Error(errors.New(p.Err), "GPU left out of the published devices", "index", p.Index, "uuid", p.UUID, "migDevice", p.MIGDevice)
	}
	if !slices.Equal(before, inv.Problems) {
		msgs := make([]string, len(inv.Problems))
		for i, p := range inv.Problems {
			msgs[i] = p.Err
		}
		e.node(corev1.EventTypeWarning, "GPUsLeftOut", fmt.Sprintf("%d GPU(s) or MIG device(s) left out of the published devices: %s", len(inv.Problems), strings.Join(msgs, "; ")))
	}
}

// discoveryFailed logs every failed discovery, and records a Node event only
// when the failure is new or different from the previous one: a node with
// no driver would otherwise get an event every 30 s forever.
func (e *events) discoveryFailed(logger klog.Logger, err, previous error, published int, retry time.Duration) {
	if err == nil {
		return
	}
	if errors.Is(err, hardware.ErrUnavailable) {
		logger.Error(err, "NVML is not available; publishing the devices known so far and retrying", "publishedDevices", published, "retryIn", retry)
	} else {
		logger.Error(err, "GPU discovery failed; publishing the devices known so far and retrying", "publishedDevices", published, "retryIn", retry)
	}
	if previous == nil || previous.Error() != err.Error() {
		e.node(corev1.EventTypeWarning, "GPUDiscoveryFailed", fmt.Sprintf("GPU discovery failed; publishing the devices known so far and retrying: %v", err))
	}
}
