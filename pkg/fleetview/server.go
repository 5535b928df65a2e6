package fleetview

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
)

//go:embed web
var web embed.FS

// DefaultDriver is the driver whose devices a fleet view shows by default.
const DefaultDriver = v1beta1.GPUDriverName

// Options configure a [Server].
type Options struct {
	// Driver is the DRA driver whose devices are shown (default
	// gpu.nvidia.com).
	Driver string
	// Debounce is how long changes are collected before the model is
	// rebuilt and the changed nodes sent (default 200 ms).
	Debounce time.Duration
	// ProbeInterval is how often the API server is asked for /version
	// (default 2 s).
	ProbeInterval time.Duration
	// Probe replaces the /version probe (tests).
	Probe Probe
}

// Server serves the fleet view of one cluster.
type Server struct {
	opts   Options
	source *Source
	hub    *hub

	mu       sync.Mutex
	apiErr   string
	apiSince time.Time
	slices   int
	status   chan struct{}
}

// New returns a fleet view of the cluster client talks to; Run starts
// watching it.
func New(client kubernetes.Interface, opts Options) *Server {
	if opts.Driver == "" {
		opts.Driver = DefaultDriver
	}
	if opts.Debounce <= 0 {
		opts.Debounce = 200 * time.Millisecond
	}
	if opts.ProbeInterval <= 0 {
		opts.ProbeInterval = 2 * time.Second
	}
	if opts.Probe == nil {
		opts.Probe = VersionProbe(client)
	}
	s := &Server{opts: opts, hub: newHub(), status: make(chan struct{}, 1)}
	s.source = NewSource(client, func() { s.statusChanged() })
	return s
}

func (s *Server) statusChanged() {
	select {
	case s.status <- struct{}{}:
	default:
	}
}

// Run watches the cluster and keeps the model current until ctx is done.
func (s *Server) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { s.source.Run(ctx) })
	wg.Go(func() { s.probe(ctx) })
	wg.Go(func() { s.rebuild(ctx) })
	wg.Go(func() {
		// Also every second: an informer's sync shows in HasSynced only
		// after the list call that reported it.
		ticker := time.NewTicker(time.Second)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-s.status:
			case <-ticker.C:
			}
			s.publishStatus(ctx)
		}
	})
	wg.Wait()
}

// rebuild rebuilds the model at most once per debounce interval while
// objects change, and sends the pages the nodes that changed.
func (s *Server) rebuild(ctx context.Context) {
	logger := klog.FromContext(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.source.Changed():
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(s.opts.Debounce):
		}
		start := time.Now()
		fleet := Build(s.source.Objects(s.opts.Driver))
		built := time.Since(start)
		changed, err := s.hub.publishFleet(fleet)
		if err != nil {
			logger.Error(err, "Fleet view: encode the model")
			continue
		}
		logger.V(4).Info("Fleet view rebuilt", "nodes", len(fleet.Nodes), "changed", changed, "build", built, "total", time.Since(start))
		s.mu.Lock()
		s.slices = fleet.Slices
		s.mu.Unlock()
		s.publishStatus(ctx)
	}
}

// probe asks the API server for /version every ProbeInterval.
func (s *Server) probe(ctx context.Context) {
	ticker := time.NewTicker(s.opts.ProbeInterval)
	defer ticker.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		err := s.opts.Probe(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		s.mu.Lock()
		old := s.apiErr
		switch {
		case err == nil:
			s.apiErr = ""
		case old == "":
			s.apiErr, s.apiSince = err.Error(), time.Now()
		default:
			s.apiErr = err.Error()
		}
		changed := (old == "") != (s.apiErr == "")
		s.mu.Unlock()
		if changed {
			klog.FromContext(ctx).Info("Fleet view: API server", "answers", err == nil, "err", err)
			s.statusChanged()
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

func (s *Server) publishStatus(ctx context.Context) {
	st := Status{Driver: s.opts.Driver, Resources: s.source.Statuses()}
	s.mu.Lock()
	st.Slices = s.slices
	if s.apiErr != "" {
		st.APIServer = s.apiErr
		st.APIServerDownSince = s.apiSince.UTC().Format(time.RFC3339)
	}
	s.mu.Unlock()
	if err := s.hub.publishStatus(st); err != nil {
		klog.FromContext(ctx).Error(err, "Fleet view: encode the status")
	}
}

// Handler serves the page (GET /), its assets, the snapshot (GET
// /api/snapshot) and the event stream (GET /api/events).
func (s *Server) Handler() http.Handler {
	assets, _ := fs.Sub(web, "web")
	mux := http.NewServeMux()
	mux.Handle("GET /", http.FileServerFS(assets))
	mux.HandleFunc("GET /api/snapshot", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(s.hub.snapshot())
	})
	mux.HandleFunc("GET /api/events", s.serveEvents)
	return mux
}

// heartbeat keeps idle event streams open through proxies.
const heartbeat = 15 * time.Second

// serveEvents streams server-sent events: first "snapshot" (every node),
// then "delta" (the nodes that changed) and "status".
func (s *Server) serveEvents(w http.ResponseWriter, r *http.Request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	snapshot, sub := s.hub.subscribe()
	defer s.hub.unsubscribe(sub)
	if err := writeEvent(w, event{name: "snapshot", data: snapshot}); err != nil {
		return
	}
	flusher.Flush()
	ticker := time.NewTicker(heartbeat)
	defer ticker.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case ev, ok := <-sub.ch:
			if !ok {
				// Dropped for falling behind: the page reconnects and
				// starts over from a snapshot.
				return
			}
			if err := writeEvent(w, ev); err != nil {
				return
			}
		case <-ticker.C:
			if _, err := fmt.Fprint(w, ": heartbeat\n\n"); err != nil {
				return
			}
		}
		flusher.Flush()
	}
}

func writeEvent(w http.ResponseWriter, ev event) error {
	_, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", ev.name, ev.data)
	return err
}

// Serve serves handler on the listener until ctx is done.
func Serve(ctx context.Context, l net.Listener, handler http.Handler) error {
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		_ = srv.Close()
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("fleet view on %s: %w", l.Addr(), err)
	}
	return nil
}
