package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// startServer runs Run on a loopback port and returns its address; the
// server stops at the end of the test.
func startServer(t *testing.T, cfg Config) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, l, cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	// The listener queues connections at once; a handshake waits for Run
	// to have its certificate.
	servedCert(t, l.Addr().String())
	return l.Addr().String()
}

// servedCert returns the certificate the server at addr presents.
func servedCert(t *testing.T, addr string) *x509.Certificate {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the test looks at the certificate
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// get GETs path from the server at addr, trusting caPEM.
func get(t *testing.T, addr, path string, caPEM []byte) (int, string) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 10 * time.Second}
	resp, err := client.Get("https://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestServingCertificateReloaded: replacing the certificate files makes
// the running server present the new certificate.
func TestServingCertificateReloaded(t *testing.T) {
	now := time.Now()
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	write := func() []byte {
		_, cert, key, err := newSelfSigned([]string{"127.0.0.1", "webhook.gpudra.svc"}, now)
		if err != nil {
			t.Fatal(err)
		}
		// As a Secret volume updates: each file replaced whole.
		if err := writeAtomically(certFile, cert, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := writeAtomically(keyFile, key, 0o600); err != nil {
			t.Fatal(err)
		}
		block, _ := pem.Decode(cert)
		return block.Bytes
	}
	first := write()
	addr := startServer(t, Config{Handler: newHandler(t), CertFile: certFile, KeyFile: keyFile})
	if got := servedCert(t, addr); !bytes.Equal(got.Raw, first) {
		t.Fatal("the server does not present the certificate of the files")
	}
	second := write()
	deadline := time.Now().Add(30 * time.Second)
	for !bytes.Equal(servedCert(t, addr).Raw, second) {
		if time.Now().After(deadline) {
			t.Fatal("the server still presents the old certificate 30s after the files changed")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestSelfSignedBootstrap: without certificate files the webhook makes a
// CA and a serving certificate, serves it, and sets the CA as the caBundle
// of every webhook of its configuration, created after the webhook
// started; a restart keeps the CA.
func TestSelfSignedBootstrap(t *testing.T) {
	dir := t.TempDir()
	client := fake.NewClientset()
	cfg := Config{
		Handler:           newHandler(t),
		CertFile:          filepath.Join(dir, "missing", "tls.crt"), // cert-manager's Secret is not there
		KeyFile:           filepath.Join(dir, "missing", "tls.key"),
		SelfSignedDir:     filepath.Join(dir, "self"),
		SelfSignedHosts:   []string{"gpudra-webhook.gpudra.svc", "127.0.0.1"},
		WebhookConfigName: "gpudra-webhook",
		Client:            client,
		CABundleInterval:  20 * time.Millisecond,
	}
	addr := startServer(t, cfg)
	caPEM, err := os.ReadFile(filepath.Join(dir, "self", SelfSignedCAFile))
	if err != nil {
		t.Fatal(err)
	}
	// Verified against the CA: 127.0.0.1 is among the hosts.
	if code, body := get(t, addr, "/readyz", caPEM); code != http.StatusOK || body != "ok" {
		t.Errorf("/readyz: %d %q", code, body)
	}
	if code, _ := get(t, addr, "/healthz", caPEM); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	cert := servedCert(t, addr)
	if !slices.Contains(cert.DNSNames, "gpudra-webhook.gpudra.svc") || len(cert.IPAddresses) != 1 || !cert.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)) {
		t.Errorf("served certificate for %v %v", cert.DNSNames, cert.IPAddresses)
	}

	ctx := context.Background()
	vwcs := client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "gpudra-webhook"},
		Webhooks:   []admissionregistrationv1.ValidatingWebhook{{Name: "a.gpudra.io"}, {Name: "b.gpudra.io", ClientConfig: admissionregistrationv1.WebhookClientConfig{CABundle: []byte("stale")}}},
	}
	if _, err := vwcs.Create(ctx, vwc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := vwcs.Get(ctx, "gpudra-webhook", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(got.Webhooks[0].ClientConfig.CABundle, caPEM) && bytes.Equal(got.Webhooks[1].ClientConfig.CABundle, caPEM) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("caBundles never set: %q, %q", got.Webhooks[0].ClientConfig.CABundle, got.Webhooks[1].ClientConfig.CABundle)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A restart finds the files valid and keeps them.
	again, err := EnsureSelfSigned(cfg.SelfSignedDir, cfg.SelfSignedHosts, time.Now())
	if err != nil || !bytes.Equal(again, caPEM) {
		t.Errorf("EnsureSelfSigned again: new CA (err %v)", err)
	}
	// Another host, or a certificate about to expire, makes new ones.
	for name, tc := range map[string]struct {
		hosts []string
		now   time.Time
	}{
		"new host":        {[]string{"gpudra-webhook.other.svc"}, time.Now()},
		"about to expire": {cfg.SelfSignedHosts, time.Now().Add(selfSignedValidity - 24*time.Hour)},
	} {
		dir2 := t.TempDir()
		for _, f := range []string{SelfSignedCAFile, SelfSignedCertFile, SelfSignedKeyFile} {
			data, err := os.ReadFile(filepath.Join(cfg.SelfSignedDir, f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir2, f), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		got, err := EnsureSelfSigned(dir2, tc.hosts, tc.now)
		if err != nil || bytes.Equal(got, caPEM) {
			t.Errorf("%s: kept the old CA (err %v)", name, err)
		}
		if _, err := checkSelfSigned(dir2, tc.hosts, tc.now); err != nil {
			t.Errorf("%s: the new files do not pass: %v", name, err)
		}
	}
}

// TestCertificateFlags: certificate files win over a self-signed one;
// without either there is an error.
func TestCertificateFlags(t *testing.T) {
	dir := t.TempDir()
	if _, _, _, err := (&Config{}).certificate(time.Now()); err == nil {
		t.Error("no certificate accepted")
	}
	if _, err := EnsureSelfSigned(dir, []string{"x.svc"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	cert, key := filepath.Join(dir, SelfSignedCertFile), filepath.Join(dir, SelfSignedKeyFile)
	c := &Config{CertFile: cert, KeyFile: key, SelfSignedDir: filepath.Join(dir, "self"), SelfSignedHosts: []string{"x.svc"}}
	gotCert, gotKey, ca, err := c.certificate(time.Now())
	if err != nil || gotCert != cert || gotKey != key || ca != nil {
		t.Errorf("certificate() = %s, %s, CA %v, %v; want the files, no CA", gotCert, gotKey, ca != nil, err)
	}
	if _, err := os.Stat(c.SelfSignedDir); !os.IsNotExist(err) {
		t.Errorf("self-signed directory made although the files exist: %v", err)
	}

	// As the chart runs it: both flags point into the self-signed
	// directory. A restart with the files there is still self-signed, so
	// the CA keeps being put into the caBundle.
	self := &Config{CertFile: cert, KeyFile: key, SelfSignedDir: dir, SelfSignedHosts: []string{"x.svc"}}
	ca1, err := os.ReadFile(filepath.Join(dir, SelfSignedCAFile))
	if err != nil {
		t.Fatal(err)
	}
	gotCert, gotKey, ca, err = self.certificate(time.Now())
	if err != nil || gotCert != cert || gotKey != key || !bytes.Equal(ca, ca1) {
		t.Errorf("restart of a self-signed webhook: %s, %s, same CA %v, %v; want its files and CA", gotCert, gotKey, bytes.Equal(ca, ca1), err)
	}
}
