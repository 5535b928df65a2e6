package webhook

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/klog/v2"
)

// ValidatePath is the HTTP path of the admission handler.
const ValidatePath = "/validate"

// ServingTLS is a TLS configuration whose serving certificate is read from
// files and read again when they change, so that a certificate renewed by
// cert-manager (a Secret volume updated in place) is served without a
// restart. The files are watched with fsnotify and checked every minute
// regardless, by k8s.io/apiserver's dynamiccertificates, as kube-apiserver
// does with its own certificate. A pair that does not load (the key does
// not match the certificate, as while one file is written and the other not
// yet) is skipped, and the last good pair stays served.
type ServingTLS struct {
	content    *dynamiccertificates.DynamicCertKeyPairContent
	controller *dynamiccertificates.DynamicServingCertificateController
}

// NewServingTLS reads the certificate and key files, which must hold a
// matching pair. Run watches them.
func NewServingTLS(certFile, keyFile string) (*ServingTLS, error) {
	content, err := dynamiccertificates.NewDynamicServingContentFromFiles("webhook", certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("serving certificate %s, key %s: %w", certFile, keyFile, err)
	}
	controller := dynamiccertificates.NewDynamicServingCertificateController(
		&tls.Config{MinVersion: tls.VersionTLS12}, nil, content, nil, nil)
	content.AddListener(controller)
	if err := controller.RunOnce(); err != nil {
		return nil, fmt.Errorf("serving certificate %s, key %s: %w", certFile, keyFile, err)
	}
	return &ServingTLS{content: content, controller: controller}, nil
}

// Run watches the files until ctx is cancelled.
func (s *ServingTLS) Run(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.content.Run(ctx, 1)
	}()
	s.controller.Run(1, ctx.Done())
	<-done
}

// Config returns the TLS configuration to serve with; it picks the current
// certificate for every connection.
func (s *ServingTLS) Config() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		GetConfigForClient: s.controller.GetConfigForClient,
	}
}

// NewMux returns the webhook's HTTP handlers: the admission handler at
// [ValidatePath], and the probes /healthz and /readyz, which answer "ok"
// while the server serves.
func NewMux(h http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle(ValidatePath, h)
	ok := func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }
	mux.HandleFunc("/healthz", ok)
	mux.HandleFunc("/readyz", ok)
	return mux
}

// Serve serves h's mux (see [NewMux]) over TLS on l until ctx is
// cancelled, then shuts down gracefully, and watches certs meanwhile.
// Requests get a logger from ctx.
func Serve(ctx context.Context, l net.Listener, h http.Handler, certs *ServingTLS) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		certs.Run(ctx)
	}()
	srv := &http.Server{
		Handler:           NewMux(h),
		TLSConfig:         certs.Config(),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	served := make(chan error, 1)
	go func() { served <- srv.ServeTLS(l, "", "") }()
	var err error
	select {
	case err = <-served:
	case <-ctx.Done():
		shutdownCtx, done := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer done()
		if err := srv.Shutdown(shutdownCtx); err != nil {
			klog.FromContext(ctx).Error(err, "Shut down webhook server")
		}
		err = <-served
	}
	cancel()
	<-watched
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
