package uprun

import (
	"context"
	"fmt"
	"net"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/pkg/fleetview"
)

// listenFleetView listens on --fleet-view's address, before the cluster
// starts: an address that cannot be had fails the run at once.
func listenFleetView(addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--fleet-view %s: %w", addr, err)
	}
	return l, nil
}

// serveFleetView serves the fleet view of the local cluster on l until
// ctx is done, and returns the page's URL.
func serveFleetView(ctx context.Context, c *cluster.Cluster, l net.Listener) (string, error) {
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
