package draplugin

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/preparer"
)

// TestReportNoticesBySeverity: a problem is an error at every publication
// and a Warning event when it appears; an expected absence (no NVLink
// fabric on an H100 node) is an Info line when it appears, nothing at the
// default verbosity while it lasts, and a Normal event, so that a cluster
// of H100 nodes does not log an error per node per discovery interval.
func TestReportNoticesBySeverity(t *testing.T) {
	problem := preparer.Notice{Reason: "MIGOwnershipUnknown", Message: "MIG devices of GPU 0 left out"}
	expected := preparer.Notice{Reason: "NoNVLinkFabric", Message: "the node cannot join a ComputeDomain", Expected: true}
	for _, tc := range []struct {
		name      string
		notice    preparer.Notice
		eventType string
		// logs are the log lines' severities (first letter, klog's
		// header) at the first publication and at the next, unchanged.
		firstLog, nextLog string
	}{
		{name: "problem", notice: problem, eventType: corev1.EventTypeWarning, firstLog: "E", nextLog: "E"},
		{name: "expected absence", notice: expected, eventType: corev1.EventTypeNormal, firstLog: "I", nextLog: ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(1), ktesting.BufferLogs(true)))
			ctx := klog.NewContext(context.Background(), logger)
			buffer := logger.GetSink().(ktesting.Underlier).GetBuffer()
			recorder := record.NewFakeRecorder(10)
			e := &events{rec: recorder, nodeRef: &corev1.ObjectReference{Kind: "Node", Name: "node-0"}}

			seen := 0
			severities := func() string {
				var s []string
				all := buffer.String()
				logged := all[seen:]
				seen = len(all)
				for line := range strings.Lines(logged) {
					if strings.Contains(line, tc.notice.Reason) {
						s = append(s, line[:1])
					}
				}
				return strings.Join(s, "")
			}

			e.reportNotices(ctx, nil, []preparer.Notice{tc.notice})
			if got := severities(); got != tc.firstLog {
				t.Errorf("first publication logged %q lines, want %q", got, tc.firstLog)
			}
			e.reportNotices(ctx, []preparer.Notice{tc.notice}, []preparer.Notice{tc.notice})
			if got := severities(); got != tc.nextLog {
				t.Errorf("unchanged publication logged %q lines at verbosity 1, want %q", got, tc.nextLog)
			}
			close(recorder.Events)
			var got []string
			for ev := range recorder.Events {
				got = append(got, ev)
			}
			want := tc.eventType + " " + tc.notice.Reason + " " + tc.notice.Message
			if len(got) != 1 || got[0] != want {
				t.Errorf("events %q, want one %q", got, want)
			}
		})
	}
}

// TestReportUnreadOncePerChange: properties discovery could not read are a
// Warning event and an error log when they change, and nothing at the
// default verbosity while they last (a GB10 node never answers memory
// info); when they are read again, an Info line says so.
func TestReportUnreadOncePerChange(t *testing.T) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(1), ktesting.BufferLogs(true)))
	ctx := klog.NewContext(context.Background(), logger)
	buffer := logger.GetSink().(ktesting.Underlier).GetBuffer()
	recorder := record.NewFakeRecorder(10)
	e := &events{rec: recorder, nodeRef: &corev1.ObjectReference{Kind: "Node", Name: "node-0"}}
	inv := func(unread ...hardware.Unread) *hardware.Inventory {
		return &hardware.Inventory{GPUs: []hardware.GPU{
			{Index: 0, UUID: "GPU-0"},
			{Index: 1, UUID: "GPU-1", Unread: unread},
		}}
	}
	memory := hardware.Unread{Property: hardware.PropertyMemory, Query: "nvmlDeviceGetMemoryInfo", Err: "ERROR_NOT_SUPPORTED"}
	root := hardware.Unread{Property: hardware.PropertyPCIeRoot, Query: "/sys/bus/pci/devices/0000:1c:00.0", Err: "permission denied"}

	seen := 0
	logged := func() string {
		all := buffer.String()
		defer func() { seen = len(all) }()
		var s []string
		for line := range strings.Lines(all[seen:]) {
			s = append(s, line[:1])
		}
		return strings.Join(s, "")
	}
	steps := []struct {
		name        string
		before, now *hardware.Inventory
		logs        string // severities of the log lines
		event       string // "" for none
	}{
		{"appears", nil, inv(memory), "E",
			"Warning GPUPropertiesUnread 1 GPU propert(ies) could not be read; the GPUs are published without them: GPU 1 (GPU-1) memory: nvmlDeviceGetMemoryInfo: ERROR_NOT_SUPPORTED"},
		{"lasts", inv(memory), inv(memory), "", ""},
		{"grows", inv(memory), inv(memory, root), "EE",
			"Warning GPUPropertiesUnread 2 GPU propert(ies) could not be read; the GPUs are published without them: " +
				"GPU 1 (GPU-1) memory: nvmlDeviceGetMemoryInfo: ERROR_NOT_SUPPORTED; GPU 1 (GPU-1) pcieRoot: /sys/bus/pci/devices/0000:1c:00.0: permission denied"},
		{"read again", inv(memory, root), inv(), "I", ""},
		{"never unread", inv(), inv(), "", ""},
	}
	for _, s := range steps {
		e.reportUnread(ctx, s.before, s.now)
		if got := logged(); got != s.logs {
			t.Errorf("%s: logged %q lines, want %q", s.name, got, s.logs)
		}
		var got string
		select {
		case got = <-recorder.Events:
		default:
		}
		if got != s.event {
			t.Errorf("%s: event %q, want %q", s.name, got, s.event)
		}
	}
}
