package nodecmd

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/nodemode"
	"github.com/gpudra/gpudra/pkg/pluginflags"
)

// kubeletPluginOptions are the command's flags; package pluginflags holds
// them so that the local cluster parses the Helm chart's arguments with
// the same flag set.
type kubeletPluginOptions struct {
	*pluginflags.KubeletPlugin
}

// NewKubeletPluginCommand runs the node's DRA kubelet plugin.
func NewKubeletPluginCommand() *cobra.Command {
	o := &kubeletPluginOptions{pluginflags.NewKubeletPlugin()}
	cmd := &cobra.Command{
		Use:   "kubelet-plugin",
		Short: "Run the node's DRA kubelet plugin: discover GPUs, publish ResourceSlices, prepare claims",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

func (o *kubeletPluginOptions) run(cmd *cobra.Command) error {
	if err := logsapi.ValidateAndApply(o.Logging, nil); err != nil {
		return err
	}
	if err := o.Check(cmd.Flags()); err != nil {
		return err
	}
	if sock := nodemode.DevicePluginListening(o.DevicePluginDir); sock != "" {
		return fmt.Errorf("a device plugin for NVIDIA GPUs serves this node (it listens on %s): a node runs the DRA plugin or a device plugin, never both, or its GPUs would be admitted twice. Move the node to one mode (label %s, docs/guides/migration.md)", sock, nodemode.Label)
	}
	for _, dir := range []string{o.PluginDataDir, o.RegistrarDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
	}
	client, err := o.kubeClient()
	if err != nil {
		return err
	}
	cfg, err := o.Config(cmd.Flags(), client, pluginflags.Host{})
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	logger := klog.FromContext(ctx)
	if cfg.TimeSlicer == nil {
		logger.Info("Time-slicing is not available: nvidia-smi not found; claims asking for it are refused", "nvidiaSMIPath", o.NVIDIASMIPath())
	}
	if cfg.MPS == nil {
		logger.Info("MPS is not available; claims asking for it are refused", "reason", cfg.MPSUnavailable)
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

func (o *kubeletPluginOptions) kubeClient() (kubernetes.Interface, error) {
	cfg, err := o.RESTConfig("kubelet-plugin")
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}
