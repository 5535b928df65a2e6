package draplugin

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

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
			e := &events{recorder: recorder, nodeRef: &corev1.ObjectReference{Kind: "Node", Name: "node-0"}}

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
