package clustertest

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestPoll(t *testing.T) {
	n := 0
	if err := Poll(context.Background(), time.Second, func() bool { n++; return n == 3 }); err != nil || n != 3 {
		t.Errorf("Poll: %v after %d checks, want nil after 3", err, n)
	}
	err := Poll(context.Background(), 3*PollInterval, func() bool { return false })
	if err == nil || !strings.Contains(err.Error(), "not within 150ms") {
		t.Errorf("Poll past its timeout: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = Poll(ctx, time.Minute, func() bool { return false })
	if err == nil || !strings.Contains(err.Error(), "the test's time") {
		t.Errorf("Poll past its context: %v", err)
	}
}
