// Package clustertest holds what the local cluster's tests share: a short
// temporary directory for unix sockets, one poll helper, quiet logs, and builders of
// the ResourceClaims, ResourceClaimTemplates and pods the tests create.
package clustertest

import (
	"context"
	"flag"
	"fmt"
	"io"
	"testing"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/internal/shorttemp"
)

// ShortTempDir returns a new directory directly under the temporary
// directory ($TMPDIR, normally /tmp), removed when the test ends: short
// enough for the unix sockets of the plugins and daemons below it, which
// t.TempDir's path, holding the test's name, is not (see package
// shorttemp of the driver module for the limit).
func ShortTempDir(tb testing.TB) string {
	tb.Helper()
	return shorttemp.Dir(tb)
}

// PollInterval is how often [Poll] and [Eventually] check their
// condition: often enough that a test waits little past the moment it
// holds, seldom enough that a condition reading the API server does not
// load it.
const PollInterval = 50 * time.Millisecond

// Poll checks cond at once and then every [PollInterval] until it holds,
// ctx ends or timeout passes (timeout 0: only ctx bounds it). The error
// says which ended the wait. For a caller that words its own failure,
// e.g. with the state it last saw.
func Poll(ctx context.Context, timeout time.Duration, cond func() bool) error {
	parent := ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			if parent.Err() == nil {
				return fmt.Errorf("not within %s", timeout)
			}
			return fmt.Errorf("not within the test's time: %w", context.Cause(parent))
		case <-tick.C:
		}
	}
	return nil
}

// Eventually waits, as [Poll] does, until cond holds, and fails the test
// naming what it waited for when it does not in time.
func Eventually(tb testing.TB, ctx context.Context, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	if err := Poll(ctx, timeout, cond); err != nil {
		tb.Fatalf("%s: %v", what, err)
	}
}

// ParseFlags parses a test binary's flags with klog's among them and,
// unless the run is verbose, keeps the components' logs out of its
// output but for messages at stderrThreshold ("ERROR", "FATAL") and
// above: the control plane and the nodes log a lot at level 0. A TestMain
// calls it before m.Run.
func ParseFlags(stderrThreshold string) {
	klog.InitFlags(nil)
	flag.Parse()
	if testing.Verbose() {
		return
	}
	_ = flag.Set("logtostderr", "false")
	_ = flag.Set("alsologtostderr", "false")
	_ = flag.Set("stderrthreshold", stderrThreshold)
	klog.SetOutput(io.Discard)
}

// GB200Pair is a fleet file of two GB200 compute trays, nvl-0 and nvl-1,
// of one NVLink clique: the smallest ComputeDomain.
const GB200Pair = `
nodes:
- name: nvl-0
  fabric:
    cliqueID: 1
  gpus: [{model: GB200}, {model: GB200}, {model: GB200}, {model: GB200}]
- name: nvl-1
  fabric:
    cliqueID: 1
  gpus: [{model: GB200}, {model: GB200}, {model: GB200}, {model: GB200}]
`
