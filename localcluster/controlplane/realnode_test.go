package controlplane

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// TestWhatARealKubeletNeeds checks what a real kubelet and its pods need
// of the control plane: the kube-root-ca.crt ConfigMap in every namespace,
// holding an authority that verifies the API server on 127.0.0.1 without
// a TLS server name (as a pod's in-cluster client does); the daemonset
// controller with Options.DaemonSets only; and a kubelet serving
// certificate signed by the authority kube-apiserver trusts.
func TestWhatARealKubeletNeeds(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	for _, daemonSets := range []bool{false, true} {
		cp, err := Start(ctx, Options{DaemonSets: daemonSets})
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(cp.Controllers(), "daemonset"); got != daemonSets {
			t.Errorf("DaemonSets %v: controllers %v", daemonSets, cp.Controllers())
		}
		if !daemonSets {
			_ = cp.Stop()
			continue
		}
		client := kubernetes.NewForConfigOrDie(cp.RESTConfig("test", 10, 20))
		var ca string
		err = clustertest.Poll(ctx, time.Minute, func() bool {
			cm, err := client.CoreV1().ConfigMaps(metav1.NamespaceDefault).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
			if err != nil {
				return false
			}
			ca = cm.Data["ca.crt"]
			return true
		})
		if err != nil {
			t.Fatalf("no kube-root-ca.crt in the default namespace: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(ca)) {
			t.Fatalf("kube-root-ca.crt holds no certificate: %q", ca)
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
		resp, err := hc.Get(cp.RESTConfig("test", 1, 1).Host + "/healthz")
		if err != nil {
			t.Errorf("the published CA does not verify the API server on 127.0.0.1: %v", err)
		} else {
			resp.Body.Close()
		}

		dir := t.TempDir()
		cert, key := filepath.Join(dir, "k.crt"), filepath.Join(dir, "k.key")
		if err := cp.WriteKubeletServingCert("node-a", cert, key); err != nil {
			t.Fatal(err)
		}
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			t.Fatal(err)
		}
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		kubeletCA := x509.NewCertPool()
		caPEM, err := os.ReadFile(filepath.Join(cp.Dir(), "apiserver", kubeletCAFile))
		if err != nil {
			t.Fatal(err)
		}
		kubeletCA.AppendCertsFromPEM(caPEM)
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: kubeletCA, DNSName: "node-a"}); err != nil {
			t.Errorf("kubelet serving certificate: %v", err)
		}
		if err := cp.Stop(); err != nil {
			t.Error(err)
		}
	}
}
