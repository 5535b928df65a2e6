package simnode

import (
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/gpudra/gpudra/pkg/metrics"
	"github.com/gpudra/gpudra/pkg/plugin"
)

// metricsServer serves the node's plugin's metrics (pkg/metrics) and its
// readiness over HTTP on 127.0.0.1, as `gpudra kubelet-plugin
// --http-endpoint` does on a real node. It outlives plugin restarts: each
// request goes to the plugin running then.
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
	current := func(w http.ResponseWriter) *plugin.Driver {
		n.pluginMu.Lock()
		d := n.plugin
		n.pluginMu.Unlock()
		if d == nil {
			http.Error(w, "the node's plugin is not running", http.StatusServiceUnavailable)
		}
		return d
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		if d := current(w); d != nil {
			d.Metrics().Handler().ServeHTTP(w, r)
		}
	})
	mux.HandleFunc(metrics.ReadyzPath, func(w http.ResponseWriter, _ *http.Request) {
		d := current(w)
		if d == nil {
			return
		}
		if err := d.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	s := &metricsServer{ln: ln, srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}, done: make(chan struct{})}
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
// Prometheus text format (http://127.0.0.1:<port>/metrics); /readyz
// beside it answers the plugin's readiness.
func (n *Node) MetricsURL() string {
	return "http://" + n.metrics.ln.Addr().String() + "/metrics"
}
