package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/version"
	"github.com/gpudra/gpudra/pkg/webhook"
)

type webhookOptions struct {
	port              int
	certFile          string
	keyFile           string
	selfSignedDir     string
	selfSignedHosts   []string
	webhookConfigName string
	driverName        string
	cdDriverName      string
	kubeconfig        string
	logging           *logsapi.LoggingConfiguration
}

func newWebhookCommand() *cobra.Command {
	cmd, _ := webhookCommand()
	return cmd
}

// webhookCommand returns the command and the options its flags set.
func webhookCommand() (*cobra.Command, *webhookOptions) {
	o := &webhookOptions{logging: logsapi.NewLoggingConfiguration()}
	cmd := &cobra.Command{
		Use:   "webhook",
		Short: "Run the validating admission webhook of the opaque configs in ResourceClaims, ResourceClaimTemplates and DeviceClasses",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd)
		},
	}
	fs := cmd.Flags()
	fs.IntVar(&o.port, "port", 8443, "HTTPS port of the webhook (path "+webhook.ValidatePath+") and its probes /healthz and /readyz")
	fs.StringVar(&o.certFile, "tls-cert-file", "", "serving certificate (PEM), e.g. from a cert-manager Secret; read again when it changes")
	fs.StringVar(&o.keyFile, "tls-private-key-file", "", "the serving certificate's private key (PEM)")
	fs.StringVar(&o.selfSignedDir, "self-signed-dir", "", "when --tls-cert-file and --tls-private-key-file are not given or do not exist: make a CA and a serving certificate in this directory (or keep those of an earlier start) and set the CA as the caBundle of --webhook-configuration-name; for clusters without cert-manager")
	fs.StringSliceVar(&o.selfSignedHosts, "self-signed-hosts", nil, "DNS names (the webhook Service's, e.g. gpudra-webhook.gpudra.svc) and IP addresses of the self-signed certificate, comma-separated")
	fs.StringVar(&o.webhookConfigName, "webhook-configuration-name", "gpudra-webhook", "ValidatingWebhookConfiguration whose webhooks' caBundle a self-signed webhook keeps set to its CA; empty: none")
	fs.StringVar(&o.driverName, "driver-name", webhook.DefaultDriverName(webhook.GPUDriver), "DRA driver name of the GPU kubelet plugin, whose opaque configs are validated; empty: none")
	fs.StringVar(&o.cdDriverName, "compute-domain-driver-name", webhook.DefaultDriverName(webhook.ComputeDomainDriver), "DRA driver name of the ComputeDomain kubelet plugin, whose opaque configs are validated; empty: none")
	fs.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file, for setting the caBundle; in-cluster config when empty (env KUBECONFIG)")
	logsapi.AddFlags(o.logging, fs)
	return cmd, o
}

// config checks the flags and returns the webhook's configuration, without
// its API client.
func (o *webhookOptions) config() (webhook.Config, error) {
	var cfg webhook.Config
	if o.port < 1 || o.port > 65535 {
		return cfg, fmt.Errorf("--port %d: must be from 1 to 65535", o.port)
	}
	if (o.certFile == "") != (o.keyFile == "") {
		return cfg, errors.New("--tls-cert-file and --tls-private-key-file: give both or neither")
	}
	if o.certFile == "" && o.selfSignedDir == "" {
		return cfg, errors.New("no serving certificate: give --tls-cert-file and --tls-private-key-file, or --self-signed-dir for a self-signed one")
	}
	if o.selfSignedDir != "" && len(o.selfSignedHosts) == 0 {
		return cfg, errors.New("--self-signed-hosts is required with --self-signed-dir: the webhook Service's DNS names, e.g. gpudra-webhook.gpudra.svc")
	}
	if o.certFile != "" && o.selfSignedDir == "" {
		for flag, path := range map[string]string{"--tls-cert-file": o.certFile, "--tls-private-key-file": o.keyFile} {
			if _, err := os.Stat(path); err != nil {
				return cfg, fmt.Errorf("%s: %w (give --self-signed-dir to make a certificate when there is none)", flag, err)
			}
		}
	}
	if o.driverName == "" && o.cdDriverName == "" {
		return cfg, errors.New("--driver-name and --compute-domain-driver-name are both empty: nothing to validate")
	}
	handler, err := webhook.NewHandler(
		webhook.WithDriverName(webhook.GPUDriver, o.driverName),
		webhook.WithDriverName(webhook.ComputeDomainDriver, o.cdDriverName))
	if err != nil {
		return cfg, fmt.Errorf("--driver-name, --compute-domain-driver-name: %w", err)
	}
	return webhook.Config{
		Handler:           handler,
		CertFile:          o.certFile,
		KeyFile:           o.keyFile,
		SelfSignedDir:     o.selfSignedDir,
		SelfSignedHosts:   o.selfSignedHosts,
		WebhookConfigName: o.webhookConfigName,
	}, nil
}

func (o *webhookOptions) run(cmd *cobra.Command) error {
	// Flags first: logging is applied once per process.
	cfg, err := o.config()
	if err != nil {
		return err
	}
	if err := logsapi.ValidateAndApply(o.logging, nil); err != nil {
		return err
	}
	return o.serve(cmd.Context(), cfg)
}

// serve runs the webhook that cfg describes until ctx is cancelled.
func (o *webhookOptions) serve(ctx context.Context, cfg webhook.Config) error {
	var err error
	logger := klog.FromContext(ctx)
	if o.selfSignedDir != "" && o.webhookConfigName != "" {
		if cfg.Client, err = o.kubeClient(); err != nil {
			return err
		}
	} else if o.selfSignedDir != "" {
		logger.Info("--webhook-configuration-name is empty: the self-signed CA must be put into the webhook's caBundle by other means")
	}
	l, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(o.port)))
	if err != nil {
		return fmt.Errorf("--port: %w", err)
	}
	defer l.Close()
	return webhook.Run(ctx, l, cfg)
}

func (o *webhookOptions) kubeClient() (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if o.kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("API client config (--kubeconfig): %w", err)
	}
	cfg.UserAgent = "gpudra-webhook/" + version.Get().UserAgentVersion()
	return kubernetes.NewForConfig(cfg)
}
