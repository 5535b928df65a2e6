package main

import (
	"context"
	"fmt"
	"net"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/pkg/fleetview"
)

// serveFleetView serves the fleet view of the local cluster on addr until
// ctx is done, and returns the page's URL.
func serveFleetView(ctx context.Context, c *cluster.Cluster, addr string) (string, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("--fleet-view %s: %w", addr, err)
	}
	client, err := kubernetes.NewForConfig(c.ControlPlane().RESTConfig("gpudra-fleet-view", 50, 100))
	if err != nil {
		l.Close()
		return "", err
	}
	view := fleetview.New(client, fleetview.Options{})
	go view.Run(ctx)
	go func() {
		if err := fleetview.Serve(ctx, l, view.Handler()); err != nil {
			klog.FromContext(ctx).Error(err, "Fleet view stopped")
		}
	}()
	return fmt.Sprintf("http://%s/", l.Addr()), nil
}
