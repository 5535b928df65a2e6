package main

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/kubeclient"
	"github.com/gpudra/gpudra/pkg/webhook"
)

// webhookOptions are the command's flags; package webhook holds them so
// that the local cluster parses the Helm chart's arguments with the same
// flag set.
type webhookOptions struct {
	*webhook.Flags
}

func newWebhookCommand() *cobra.Command {
	cmd, _ := webhookCommand()
	return cmd
}

// webhookCommand returns the command and the options its flags set.
func webhookCommand() (*cobra.Command, *webhookOptions) {
	o := &webhookOptions{webhook.NewFlags()}
	cmd := &cobra.Command{
		Use:   "webhook",
		Short: "Run the validating admission webhook of the opaque configs in ResourceClaims, ResourceClaimTemplates and DeviceClasses",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd, o
}

// config checks the flags and returns the webhook's configuration, without
// its API client.
func (o *webhookOptions) config() (webhook.Config, error) { return o.Config() }

func (o *webhookOptions) run(cmd *cobra.Command) error {
	// Flags first: logging is applied once per process.
	cfg, err := o.config()
	if err != nil {
		return err
	}
	if err := logsapi.ValidateAndApply(o.Logging, nil); err != nil {
		return err
	}
	return o.serve(cmd.Context(), cfg)
}

// serve runs the webhook that cfg describes until ctx is cancelled.
func (o *webhookOptions) serve(ctx context.Context, cfg webhook.Config) error {
	var err error
	logger := klog.FromContext(ctx)
	if o.SelfSignedDir != "" && o.WebhookConfigName != "" {
		if cfg.Client, err = o.kubeClient(); err != nil {
			return err
		}
	} else if o.SelfSignedDir != "" {
		logger.Info("--webhook-configuration-name is empty: the self-signed CA must be put into the webhook's caBundle by other means")
	}
	l, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(o.Port)))
	if err != nil {
		return fmt.Errorf("--port: %w", err)
	}
	defer l.Close()
	return webhook.Run(ctx, l, cfg)
}

func (o *webhookOptions) kubeClient() (kubernetes.Interface, error) {
	cfg, err := kubeclient.Config(o.Kubeconfig, "webhook")
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}
