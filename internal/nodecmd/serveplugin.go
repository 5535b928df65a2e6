package nodecmd

import (
	"context"
	"fmt"
	"net"

	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/metrics"
)

// listenHTTP listens on --http-endpoint before anything starts, so that a
// port in use fails at once; nil without an endpoint.
func listenHTTP(endpoint string) (net.Listener, error) {
	if endpoint == "" {
		return nil, nil
	}
	l, err := net.Listen("tcp", endpoint)
	if err != nil {
		return nil, fmt.Errorf("--http-endpoint: %w", err)
	}
	return l, nil
}

// servePlugin starts a kubelet plugin (the GPU driver's or the
// ComputeDomain driver's) with its metrics and probes on l (if any), and
// serves until ctx ends.
func servePlugin(ctx context.Context, cfg draplugin.Config, l net.Listener, metricsPath string) error {
	logger := klog.FromContext(ctx)
	driver, err := draplugin.Start(ctx, cfg)
	if err != nil {
		return err
	}
	httpDone := make(chan error, 1)
	if l != nil {
		srv := metrics.NewServer(driver.Metrics(), metricsPath, driver.Ready)
		go func() { httpDone <- srv.Serve(ctx, l) }()
		logger.Info("Serving metrics and probes", "address", l.Addr().String(), "metricsPath", metricsPath)
	}
	select {
	case <-ctx.Done():
	case err := <-httpDone:
		// The plugin goes on serving the kubelet without it.
		logger.Error(err, "HTTP server of metrics and probes stopped")
		<-ctx.Done()
	}
	logger.Info("Shutting down")
	driver.Stop()
	return nil
}
