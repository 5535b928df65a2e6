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

// ReasonGPUPropertiesUnread is the reason of the Warning Node event that
// names the properties of published GPUs discovery could not read.
const ReasonGPUPropertiesUnread = "GPUPropertiesUnread"

// reportUnread logs the properties of published GPUs that discovery could
// not read, and records a Node event when they change: the GPU is
// published, but a selector on what is unknown no longer matches it, and
// what needs it (a memory capacity, sharing, MIG, passthrough) is not
// offered. Unlike a GPU left out, the set lasts on a node that never
// answers (GB10 has no memory info), so it is an error log only when it
// changes.
func (e *events) reportUnread(ctx context.Context, previous, inv *hardware.Inventory) {
	before, now := unreadLines(previous), unreadLines(inv)
	logger := klog.FromContext(ctx)
	changed := !slices.Equal(before, now)
	if len(now) == 0 {
		if len(before) > 0 {
			logger.Info("GPU properties an earlier discovery could not read are read again", "unreadBefore", len(before))
		}
		return
	}
	for _, g := range inv.GPUs {
		for _, u := range g.Unread {
			kv := []any{"index", g.Index, "uuid", g.UUID, "property", u.Property, "query", u.Query, "err", u.Err}
			if changed {
				logger.Error(nil, "GPU published without a property discovery could not read", kv...)
			} else {
				logger.V(2).Info("GPU published without a property discovery could not read", kv...)
			}
		}
	}
	if changed {
		e.node(corev1.EventTypeWarning, ReasonGPUPropertiesUnread,
			fmt.Sprintf("%d GPU propert(ies) could not be read; the GPUs are published without them: %s", len(now), strings.Join(now, "; ")))
	}
}

// unreadLines renders the unread properties of inv's GPUs, one line each:
// "GPU 0 (GPU-...) memory: nvmlDeviceGetMemoryInfo: ERROR_NOT_SUPPORTED".
func unreadLines(inv *hardware.Inventory) []string {
	if inv == nil {
		return nil
	}
	var out []string
	for _, g := range inv.GPUs {
		for _, u := range g.Unread {
			out = append(out, fmt.Sprintf("GPU %d (%s) %s", g.Index, g.UUID, u))
		}
	}
	return out
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
