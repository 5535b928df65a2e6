package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
)

// DefaultCABundleInterval is how often a self-signed webhook checks the
// caBundle of its ValidatingWebhookConfiguration.
const DefaultCABundleInterval = 30 * time.Second

// Config is what [Run] needs; the flags of `gpudra webhook` fill it in.
type Config struct {
	// Handler decides the admission reviews.
	Handler *Handler
	// CertFile and KeyFile are the serving certificate and its key, e.g.
	// from a Secret that cert-manager keeps. When both exist they are
	// served, and read again whenever they change; unless they are the
	// files of SelfSignedDir, which the bootstrap checks and keeps.
	CertFile, KeyFile string
	// SelfSignedDir, when set, is used when CertFile and KeyFile are not
	// both there: a CA and a serving certificate for SelfSignedHosts are
	// made in it (see [EnsureSelfSigned]), or kept from an earlier start.
	SelfSignedDir string
	// SelfSignedHosts are the DNS names (the webhook Service's) and IP
	// addresses the self-signed certificate is for.
	SelfSignedHosts []string
	// WebhookConfigName is the ValidatingWebhookConfiguration whose
	// caBundle a self-signed webhook keeps set to its CA (see
	// [KeepCABundle]); empty: none. Unused with CertFile and KeyFile.
	WebhookConfigName string
	// Client sets the caBundle; needed with WebhookConfigName.
	Client kubernetes.Interface
	// CABundleInterval is how often the caBundle is checked;
	// [DefaultCABundleInterval] when zero.
	CABundleInterval time.Duration
}

// Run serves the webhook on l until ctx is cancelled (see [Serve]), with
// the certificate that cfg picks.
func Run(ctx context.Context, l net.Listener, cfg Config) error {
	logger := klog.FromContext(ctx)
	certFile, keyFile, caPEM, err := cfg.certificate(time.Now())
	if err != nil {
		return err
	}
	certs, err := NewServingTLS(certFile, keyFile)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	kept := make(chan struct{})
	if caPEM != nil && cfg.WebhookConfigName != "" {
		if cfg.Client == nil {
			return errors.New("setting the caBundle of a ValidatingWebhookConfiguration needs an API client")
		}
		interval := cfg.CABundleInterval
		if interval <= 0 {
			interval = DefaultCABundleInterval
		}
		go func() {
			defer close(kept)
			KeepCABundle(ctx, cfg.Client, cfg.WebhookConfigName, caPEM, interval)
		}()
	} else {
		close(kept)
	}
	logger.Info("Serving admission webhook", "address", l.Addr().String(), "path", ValidatePath,
		"certFile", certFile, "selfSigned", caPEM != nil, "drivers", cfg.Handler.DriverNames())
	err = Serve(ctx, l, cfg.Handler, certs)
	cancel()
	<-kept
	return err
}

// certificate returns the certificate files to serve and, when they are
// self-signed, the CA.
func (cfg *Config) certificate(now time.Time) (certFile, keyFile string, caPEM []byte, err error) {
	selfCert, selfKey := filepath.Join(cfg.SelfSignedDir, SelfSignedCertFile), filepath.Join(cfg.SelfSignedDir, SelfSignedKeyFile)
	// Files of an earlier self-signed start (a restarted container with
	// the same emptyDir, where the chart points both flags) are not a
	// certificate from elsewhere: the bootstrap keeps them, and their CA
	// in the caBundle.
	earlierSelfSigned := cfg.SelfSignedDir != "" && filepath.Clean(cfg.CertFile) == selfCert && filepath.Clean(cfg.KeyFile) == selfKey
	if cfg.CertFile != "" && cfg.KeyFile != "" && !earlierSelfSigned && exists(cfg.CertFile) && exists(cfg.KeyFile) {
		return cfg.CertFile, cfg.KeyFile, nil, nil
	}
	if cfg.SelfSignedDir == "" {
		if cfg.CertFile == "" || cfg.KeyFile == "" {
			return "", "", nil, errors.New("no serving certificate: give a certificate and key, or a directory for a self-signed one")
		}
		return cfg.CertFile, cfg.KeyFile, nil, nil // NewServingTLS names the missing file
	}
	caPEM, err = EnsureSelfSigned(cfg.SelfSignedDir, cfg.SelfSignedHosts, now)
	if err != nil {
		return "", "", nil, fmt.Errorf("self-signed certificate in %s: %w", cfg.SelfSignedDir, err)
	}
	return selfCert, selfKey, caPEM, nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
