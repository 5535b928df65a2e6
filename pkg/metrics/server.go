package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// Paths of the probes Server serves beside the metrics.
const (
	LivezPath  = "/livez"
	ReadyzPath = "/readyz"
	HealthPath = "/healthz"
)

// Server serves the metrics and the probes over HTTP:
//
//   - metricsPath: the metrics, in the Prometheus text format;
//   - /livez and /healthz: 200 while the process serves HTTP at all;
//   - /readyz: 200 once ready returns nil, else 503 with its error.
type Server struct {
	srv *http.Server
}

// NewServer returns a server of p's metrics at metricsPath, with ready as
// the readiness check: what [Handler] serves.
func NewServer(p *Plugin, metricsPath string, ready func() error) *Server {
	return &Server{srv: &http.Server{Handler: Handler(p, metricsPath, ready), ReadHeaderTimeout: 10 * time.Second}}
}

// Handler serves what [Server] serves: p's metrics at metricsPath, /livez
// and /healthz, and /readyz answering ready. Anything else serving the
// plugin's HTTP endpoint (the local cluster's simulated nodes) uses it, so
// that its paths are the real ones.
func Handler(p *Plugin, metricsPath string, ready func() error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(metricsPath, p.Handler())
	ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = fmt.Fprintln(w, "ok") }
	mux.HandleFunc(LivezPath, ok)
	mux.HandleFunc(HealthPath, ok)
	mux.HandleFunc(ReadyzPath, func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		ok(w, nil)
	})
	return mux
}

// Serve serves on ln until ctx ends, then shuts down, giving requests in
// flight a few seconds.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	errs := make(chan error, 1)
	go func() { errs <- s.srv.Serve(ln) }()
	select {
	case err := <-errs:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-errs; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
