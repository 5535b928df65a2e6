package webhook

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// Flags are the flags of `gpudra webhook`. The binary parses its command
// line with them, and the local cluster parses the Helm chart's webhook
// container arguments with the same flag set.
type Flags struct {
	Port              int
	CertFile          string
	KeyFile           string
	SelfSignedDir     string
	SelfSignedHosts   []string
	WebhookConfigName string
	DriverName        string
	CDDriverName      string
	Kubeconfig        string
	Logging           *logsapi.LoggingConfiguration
}

// NewFlags returns the flags' holder with its logging configuration.
func NewFlags() *Flags {
	return &Flags{Logging: logsapi.NewLoggingConfiguration()}
}

// ParseFlags parses args (the flags after `gpudra webhook`) with the
// command's flag set.
func ParseFlags(args []string) (*Flags, error) {
	o := NewFlags()
	fs := pflag.NewFlagSet("webhook", pflag.ContinueOnError)
	fs.SetOutput(&strings.Builder{})
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("webhook %s: %w", strings.Join(args, " "), err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("webhook: unexpected arguments %q", fs.Args())
	}
	return o, nil
}

// AddFlags adds every flag of `gpudra webhook` to fs.
func (o *Flags) AddFlags(fs *pflag.FlagSet) {
	fs.IntVar(&o.Port, "port", 8443, "HTTPS port of the webhook (path "+ValidatePath+") and its probes /healthz and /readyz")
	fs.StringVar(&o.CertFile, "tls-cert-file", "", "serving certificate (PEM), e.g. from a cert-manager Secret; read again when it changes")
	fs.StringVar(&o.KeyFile, "tls-private-key-file", "", "the serving certificate's private key (PEM)")
	fs.StringVar(&o.SelfSignedDir, "self-signed-dir", "", "when --tls-cert-file and --tls-private-key-file are not given or do not exist: make a CA and a serving certificate in this directory (or keep those of an earlier start) and set the CA as the caBundle of --webhook-configuration-name; for clusters without cert-manager")
	fs.StringSliceVar(&o.SelfSignedHosts, "self-signed-hosts", nil, "DNS names (the webhook Service's, e.g. gpudra-webhook.gpudra.svc) and IP addresses of the self-signed certificate, comma-separated")
	fs.StringVar(&o.WebhookConfigName, "webhook-configuration-name", "gpudra-webhook", "ValidatingWebhookConfiguration whose webhooks' caBundle a self-signed webhook keeps set to its CA; empty: none")
	fs.StringVar(&o.DriverName, "driver-name", DefaultDriverName(GPUDriver), "DRA driver name of the GPU kubelet plugin, whose opaque configs are validated; empty: none")
	fs.StringVar(&o.CDDriverName, "compute-domain-driver-name", DefaultDriverName(ComputeDomainDriver), "DRA driver name of the ComputeDomain kubelet plugin, whose opaque configs are validated; empty: none")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file, for setting the caBundle; in-cluster config when empty (env KUBECONFIG)")
	logsapi.AddFlags(o.Logging, fs)
}

// Config checks the flags and returns the webhook's configuration, without
// its API client.
func (o *Flags) Config() (Config, error) {
	var cfg Config
	if o.Port < 1 || o.Port > 65535 {
		return cfg, fmt.Errorf("--port %d: must be from 1 to 65535", o.Port)
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return cfg, errors.New("--tls-cert-file and --tls-private-key-file: give both or neither")
	}
	if o.CertFile == "" && o.SelfSignedDir == "" {
		return cfg, errors.New("no serving certificate: give --tls-cert-file and --tls-private-key-file, or --self-signed-dir for a self-signed one")
	}
	if o.SelfSignedDir != "" && len(o.SelfSignedHosts) == 0 {
		return cfg, errors.New("--self-signed-hosts is required with --self-signed-dir: the webhook Service's DNS names, e.g. gpudra-webhook.gpudra.svc")
	}
	if o.CertFile != "" && o.SelfSignedDir == "" {
		// In a fixed order, so that the error names the certificate first.
		for _, f := range []struct{ flag, path string }{{"--tls-cert-file", o.CertFile}, {"--tls-private-key-file", o.KeyFile}} {
			flag, path := f.flag, f.path
			if _, err := os.Stat(path); err != nil {
				return cfg, fmt.Errorf("%s: %w (give --self-signed-dir to make a certificate when there is none)", flag, err)
			}
		}
	}
	if o.DriverName == "" && o.CDDriverName == "" {
		return cfg, errors.New("--driver-name and --compute-domain-driver-name are both empty: nothing to validate")
	}
	handler, err := NewHandler(
		WithDriverName(GPUDriver, o.DriverName),
		WithDriverName(ComputeDomainDriver, o.CDDriverName))
	if err != nil {
		return cfg, fmt.Errorf("--driver-name, --compute-domain-driver-name: %w", err)
	}
	return Config{
		Handler:           handler,
		CertFile:          o.CertFile,
		KeyFile:           o.KeyFile,
		SelfSignedDir:     o.SelfSignedDir,
		SelfSignedHosts:   o.SelfSignedHosts,
		WebhookConfigName: o.WebhookConfigName,
	}, nil
}
