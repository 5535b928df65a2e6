package cdbench

import (
	"net/http"
	"strings"
	"sync/atomic"
)

// requestTally counts one client's API requests: all, successful writes,
// ConfigMap updates and patches (the index registry's write attempts,
// either way it is written) and conflicts.
type requestTally struct {
	requests, writes, updates, conflicts atomic.Int64
}

// add adds o's counts to t.
func (t *requestTally) add(o *requestTally) {
	t.requests.Add(o.requests.Load())
	t.writes.Add(o.writes.Load())
	t.updates.Add(o.updates.Load())
	t.conflicts.Add(o.conflicts.Load())
}

// countingTransport is an http.RoundTripper that tallies what passes
// through it: the client side of a node's traffic, with the status codes
// the API server's own request counts do not keep.
type countingTransport struct {
	next  http.RoundTripper
	tally *requestTally
}

// RoundTrip implements [http.RoundTripper].
func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.next.RoundTrip(req)
	c.tally.requests.Add(1)
	if (req.Method == http.MethodPut || req.Method == http.MethodPatch) && strings.Contains(req.URL.Path, "/configmaps/") {
		c.tally.updates.Add(1)
	}
	if err != nil {
		return resp, err
	}
	if resp.StatusCode == http.StatusConflict {
		c.tally.conflicts.Add(1)
	}
	if req.Method != http.MethodGet && resp.StatusCode/100 == 2 {
		c.tally.writes.Add(1)
	}
	return resp, nil
}
