package main

import (
	"context"
	"fmt"
	"io"
	"net"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpudra/gpudra/pkg/fleetview"
)

type fleetViewOptions struct {
	kubeconfig string
	context    string
	listen     string
	driverName string
}

func newFleetViewCommand() *cobra.Command {
	o := &fleetViewOptions{}
	cmd := &cobra.Command{
		Use:   "fleet-view",
		Short: "Serve a live web page of the cluster's GPUs, their claims and pods",
		Long: `Serve a read-only web page of the cluster's GPU fleet: nodes, their GPUs,
MIG devices, VFIO devices and shares, the claims and pods holding them, node
taints, device taints and health. It watches Nodes, Pods, ResourceSlices,
ResourceClaims and DeviceTaintRules (list and watch only; any user whose
kubeconfig may read them, see deployments/fleetview/clusterrole.yaml), and
the page updates itself as they change. A resource the user may not list
is named on the page; the rest is shown.`,
		Example: `  gpudra fleet-view --listen 127.0.0.1:8090
  gpudra fleet-view --kubeconfig ~/.kube/prod --context gpu-cluster`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd.Context(), cmd.OutOrStdout())
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then the in-cluster config)")
	fs.StringVar(&o.context, "context", "", "kubeconfig context to use (default: the current context)")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8090", "address (host:port) to serve the page on; the page has no login, so keep it on loopback unless anyone who reaches it may see the fleet")
	fs.StringVar(&o.driverName, "driver-name", fleetview.DefaultDriver, "DRA driver whose devices to show, as the kubelet plugin's --driver-name")
	return cmd
}

func (o *fleetViewOptions) run(ctx context.Context, out io.Writer) error {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = o.kubeconfig
	restConfig, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.context}).ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	restConfig.UserAgent = "gpudra-fleet-view"
	client, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", o.listen, err)
	}
	view := fleetview.New(client, fleetview.Options{Driver: o.driverName})
	go view.Run(ctx)
	fmt.Fprintf(out, "fleet view: http://%s/ (cluster %s)\n", l.Addr(), restConfig.Host)
	return fleetview.Serve(ctx, l, view.Handler())
}
