package simnode

import (
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/metrics"
)

// metricsPath is where the node serves its plugin's metrics: the
// chart's default (kubeletPlugin.metricsPath).
const metricsPath = "/metrics"

// metricsServer serves what `gpudra kubelet-plugin --http-endpoint` serves
// on a real node (metrics.Handler: the metrics, /livez, /healthz, /readyz)
// on 127.0.0.1. It outlives plugin restarts: each request goes to the
// plugin running then, and while none runs every path answers 503, as a
// real node's endpoint would not answer at all.
type metricsServer struct {
	ln   net.Listener
	srv  *http.Server
	done chan struct{}
}

func startMetricsServer(n *Node) (*metricsServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	var (
		mu      sync.Mutex
		served  *draplugin.Driver
		handler http.Handler
	)
	current := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.pluginMu.Lock()
		d := n.plugin
		n.pluginMu.Unlock()
		if d == nil {
			http.Error(w, "the node's plugin is not running", http.StatusServiceUnavailable)
			return
		}
		mu.Lock()
		if served != d {
			served, handler = d, metrics.Handler(d.Metrics(), metricsPath, d.Ready)
		}
		h := handler
		mu.Unlock()
		h.ServeHTTP(w, r)
	})
	s := &metricsServer{ln: ln, srv: &http.Server{Handler: current, ReadHeaderTimeout: 10 * time.Second}, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.logger.Error(err, "Metrics server stopped")
		}
	}()
	return s, nil
}

func (s *metricsServer) stop() {
	_ = s.srv.Close()
	<-s.done
}

// MetricsURL is where the node serves its plugin's metrics in the
// Prometheus text format (http://127.0.0.1:<port>/metrics); the probes
// (/livez, /healthz, /readyz) are beside it, at [Node.HTTPEndpoint]. ""
// on a node in simfleet.ModeDevicePlugin.
func (n *Node) MetricsURL() string {
	if n.metrics == nil {
		return ""
	}
	return n.HTTPEndpoint() + metricsPath
}

// HTTPEndpoint is the base URL of the node's DRA plugin's HTTP endpoint
// (http://127.0.0.1:<port>), as the chart's kubeletPlugin.httpPort is on a
// real node: metrics and probes. "" on a node in
// simfleet.ModeDevicePlugin: gpudra's device plugin serves none.
func (n *Node) HTTPEndpoint() string {
	if n.metrics == nil {
		return ""
	}
	return "http://" + n.metrics.ln.Addr().String()
}
