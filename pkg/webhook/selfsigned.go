package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
)

// The files of a self-signed bootstrap, in its directory.
const (
	SelfSignedCAFile   = "ca.crt"
	SelfSignedCertFile = "tls.crt"
	SelfSignedKeyFile  = "tls.key"
)

// selfSignedValidity is how long the bootstrap's CA and serving
// certificate are valid. Nothing renews them while the webhook runs, so
// they are long-lived; a start within renewBefore of the end makes new ones.
const (
	selfSignedValidity = 10 * 365 * 24 * time.Hour
	renewBefore        = 30 * 24 * time.Hour
)

// EnsureSelfSigned makes sure dir holds a CA certificate and a serving
// certificate and key signed by it, valid for every one of hosts (DNS names
// or IP addresses) for at least 30 more days, and returns the CA
// certificate in PEM. Files that already pass are kept, so a restarted
// webhook keeps its CA; otherwise all three are made anew, each written to
// a temporary file and renamed into place.
func EnsureSelfSigned(dir string, hosts []string, now time.Time) ([]byte, error) {
	if len(hosts) == 0 {
		return nil, errors.New("a self-signed certificate needs at least one host name")
	}
	if ca, err := checkSelfSigned(dir, hosts, now); err == nil {
		return ca, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	caPEM, certPEM, keyPEM, err := newSelfSigned(hosts, now)
	if err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{
		{SelfSignedKeyFile, keyPEM, 0o600},
		{SelfSignedCertFile, certPEM, 0o644},
		{SelfSignedCAFile, caPEM, 0o644},
	} {
		if err := writeAtomically(filepath.Join(dir, f.name), f.data, f.mode); err != nil {
			return nil, err
		}
	}
	return caPEM, nil
}

// checkSelfSigned returns the CA of dir's files if they are a valid,
// matching set for hosts at now and for renewBefore after.
func checkSelfSigned(dir string, hosts []string, now time.Time) ([]byte, error) {
	caPEM, err := os.ReadFile(filepath.Join(dir, SelfSignedCAFile))
	if err != nil {
		return nil, err
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, SelfSignedCertFile))
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, SelfSignedKeyFile))
	if err != nil {
		return nil, err
	}
	for _, at := range []time.Time{now, now.Add(renewBefore)} {
		if err := verifyServing(caPEM, certPEM, keyPEM, hosts, at); err != nil {
			return nil, err
		}
	}
	return caPEM, nil
}

// verifyServing checks that certPEM is signed by caPEM for every host at
// time at, and that keyPEM is its key.
func verifyServing(caPEM, certPEM, keyPEM []byte, hosts []string, at time.Time) error {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return errors.New("no CA certificate")
	}
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return errors.New("no serving certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return err
	}
	for _, host := range hosts {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: host, Roots: pool, CurrentTime: at}); err != nil {
			return err
		}
	}
	keyBlock, _ := pem.Decode(keyPEM)
	if keyBlock == nil {
		return errors.New("no key")
	}
	key, err := x509.ParseECPrivateKey(keyBlock.Bytes)
	if err != nil {
		return err
	}
	if !key.PublicKey.Equal(cert.PublicKey) {
		return errors.New("key does not match the certificate")
	}
	return nil
}

// newSelfSigned returns a new CA certificate, and a serving certificate
// for hosts signed by it with its key, in PEM.
func newSelfSigned(hosts []string, now time.Time) (caPEM, certPEM, keyPEM []byte, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	caTemplate := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: fmt.Sprintf("gpudra-webhook-ca@%d", now.Unix())},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(selfSignedValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	template := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: hosts[0]},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(selfSignedValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			template.IPAddresses = append(template.IPAddresses, ip)
		} else {
			template.DNSNames = append(template.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

// writeAtomically replaces path with data: readers see the old file or the
// new one, never a part.
func writeAtomically(path string, data []byte, mode os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// PatchCABundle sets the caBundle of every webhook of the
// ValidatingWebhookConfiguration name to caPEM, unless all have it. It
// reports whether it changed the configuration.
func PatchCABundle(ctx context.Context, client kubernetes.Interface, name string, caPEM []byte) (bool, error) {
	changed := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		changed = false
		vwcs := client.AdmissionregistrationV1().ValidatingWebhookConfigurations()
		vwc, err := vwcs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i := range vwc.Webhooks {
			if !bytes.Equal(vwc.Webhooks[i].ClientConfig.CABundle, caPEM) {
				vwc.Webhooks[i].ClientConfig.CABundle = caPEM
				changed = true
			}
		}
		if !changed {
			return nil
		}
		_, err = vwcs.Update(ctx, vwc, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return false, fmt.Errorf("set caBundle of ValidatingWebhookConfiguration %s: %w", name, err)
	}
	return changed, nil
}

// KeepCABundle sets the caBundle of the ValidatingWebhookConfiguration
// name to caPEM now and every interval until ctx is cancelled: the
// configuration may be created after the webhook starts, and an upgrade
// that applies it again empties its caBundle. Errors are logged, and
// retried at the next interval.
func KeepCABundle(ctx context.Context, client kubernetes.Interface, name string, caPEM []byte, interval time.Duration) {
	logger := klog.FromContext(ctx).WithValues("validatingWebhookConfiguration", name)
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		changed, err := PatchCABundle(ctx, client, name, caPEM)
		switch {
		case apierrors.IsNotFound(err):
			logger.Info("ValidatingWebhookConfiguration not found yet; its caBundle is set once it exists")
		case err != nil && ctx.Err() == nil:
			logger.Error(err, "Set caBundle")
		case changed:
			logger.Info("Set caBundle to the self-signed CA")
		}
	}, interval)
}
