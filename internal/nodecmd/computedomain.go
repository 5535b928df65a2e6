package nodecmd

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/gpudra/gpudra/pkg/features/imexchannel"
	"github.com/gpudra/gpudra/pkg/pluginflags"
)

// NewComputeDomainKubeletPluginCommand runs the channel plugin; package
// pluginflags holds its flags so that the local cluster parses the Helm
// chart's arguments with the same flag set.
func NewComputeDomainKubeletPluginCommand() *cobra.Command {
	o := pluginflags.NewComputeDomainPlugin()
	cmd := &cobra.Command{
		Use:   "compute-domain-kubelet-plugin",
		Short: "Run the node's ComputeDomain kubelet plugin: publish IMEX channel and daemon devices, prepare channel claims",
		Long: `Run the kubelet plugin of driver compute-domain.nvidia.com on a node of a
multi-node NVLink fabric. It is the same plugin shell as kubelet-plugin
(checkpoint, sweep, adoption, publishing) with the ComputeDomain features:
it publishes channel-0 and daemon-0, and prepares a channel claim by giving
its containers the channel its ComputeDomain holds (status.channel, which
compute-domain-controller assigns). A node with no GPU in a multi-node
NVLink clique cannot join a domain: it publishes an empty pool, logs why,
and publishes its devices once discovery finds the fabric. See
docs/guides/computedomain.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runComputeDomainPlugin(cmd, o)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func runComputeDomainPlugin(cmd *cobra.Command, o *pluginflags.ComputeDomainPlugin) error {
	if err := logsapi.ValidateAndApply(o.Logging, nil); err != nil {
		return err
	}
	if err := o.Validate(); err != nil {
		return err
	}
	for _, dir := range []string{o.PluginDataDir, o.RegistrarDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
	}
	rc, err := o.RESTConfig("compute-domain-kubelet-plugin")
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	imexd, err := o.IMEX.NodeDaemon(ctx, kube, dyn, o.NodeName, o.PluginDataDir)
	if err != nil {
		return err
	}
	// A nil *node.Daemon must stay a nil interface: channels only.
	var daemon imexchannel.Daemon
	if imexd != nil {
		daemon = imexd
		go func() { _ = imexd.Run(ctx) }()
	}
	cfg, err := o.Config(kube, dyn, nil, daemon)
	if err != nil {
		return err
	}
	httpListener, err := listenHTTP(o.HTTPEndpoint)
	if err != nil {
		return err
	}
	if httpListener != nil {
		defer httpListener.Close()
	}
	return servePlugin(ctx, cfg, httpListener, o.MetricsPath)
}
