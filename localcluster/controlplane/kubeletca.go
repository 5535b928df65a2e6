package controlplane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// kubeletCA is the authority of the kubelet API in the local cluster: it
// signs each simulated node's serving certificate (for 127.0.0.1 and the
// node's name), which kube-apiserver verifies as
// --kubelet-certificate-authority. kube-apiserver shows the nodes no
// client certificate: with one given as files, its kubelet client starts
// certificate-reloading goroutines that outlive the server, and the
// nodes' API serves nothing but what the report tells anyway, on
// loopback. It lives as long as the control plane.
type kubeletCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// kubeletCAFile is the authority's certificate, under kube-apiserver's
// certificate directory.
const kubeletCAFile = "kubelet-ca.crt"

// newKubeletCA makes a new authority and writes its certificate to dir.
func newKubeletCA(dir string) (*kubeletCA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "gpudra-sim kubelet CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("kubelet CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, kubeletCAFile), pemBlock("CERTIFICATE", der), 0o600); err != nil {
		return nil, err
	}
	return &kubeletCA{cert: cert, key: key}, nil
}

type issued struct{ certPEM, keyPEM []byte }

// issue signs a new key's certificate for the given names and usage.
func (ca *kubeletCA) issue(commonName string, ips []net.IP, dnsNames []string, usage x509.ExtKeyUsage) (issued, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return issued{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return issued{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		IPAddresses:  ips,
		DNSNames:     dnsNames,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return issued{}, fmt.Errorf("certificate for %s: %w", commonName, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return issued{}, err
	}
	return issued{certPEM: pemBlock("CERTIFICATE", der), keyPEM: pemBlock("EC PRIVATE KEY", keyDER)}, nil
}

// KubeletServerTLS returns the TLS config of a simulated node's kubelet
// API server: a serving certificate for 127.0.0.1 and the node's name,
// signed by the authority kube-apiserver trusts.
func (c *ControlPlane) KubeletServerTLS(nodeName string) (*tls.Config, error) {
	serving, err := c.api.kubeletCA.issue(nodeName, []net.IP{net.IPv4(127, 0, 0, 1)}, []string{nodeName}, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(serving.certPEM, serving.keyPEM)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// WriteKubeletServingCert writes a serving certificate and its key for a
// real kubelet's API on 127.0.0.1 (its tlsCertFile and tlsPrivateKeyFile),
// signed by the authority kube-apiserver trusts, as KubeletServerTLS does
// for a simulated node: for 127.0.0.1, the node's name and the machine's
// addresses, one of which the kubelet reports as the Node's and
// kube-apiserver verifies (it dials it on 127.0.0.1, see dialKubelet).
func (c *ControlPlane) WriteKubeletServingCert(nodeName, certFile, keyFile string) error {
	ips := append([]net.IP{net.IPv4(127, 0, 0, 1)}, machineIPs()...)
	serving, err := c.api.kubeletCA.issue(nodeName, ips, []string{nodeName}, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return err
	}
	if err := os.WriteFile(certFile, serving.certPEM, 0o600); err != nil {
		return fmt.Errorf("kubelet serving certificate of %s: %w", nodeName, err)
	}
	if err := os.WriteFile(keyFile, serving.keyPEM, 0o600); err != nil {
		return fmt.Errorf("kubelet serving key of %s: %w", nodeName, err)
	}
	return nil
}
