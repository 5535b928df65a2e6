package controlplane

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
)

// apiServer is a running kube-apiserver.
type apiServer struct {
	// config is the loopback client config: a privileged token and the
	// server's self-signed CA, with the TLS server name
	// "apiserver-loopback-client".
	config *rest.Config
	done   <-chan error
	cancel context.CancelFunc
	// requests counts the requests the server handled.
	requests *requestCounter
	// kubeletCA signs the simulated nodes' kubelet API certificates.
	kubeletCA *kubeletCA
	// routes resolve the Services kube-apiserver calls (webhooks).
	routes *serviceRoutes
}

// startAPIServer runs kube-apiserver in this process on a free loopback
// port, storing in etcd at etcdURL under a prefix of its own. It mirrors
// k8s.io/kubernetes/cmd/kube-apiserver/app/testing.StartTestServer minus
// what needs a *testing.T (ktesting's signal handlers, fixture
// certificates found through runtime.Caller, metric invariants), so that
// gpudra-sim can run it as an ordinary program. authzModes, if not empty,
// replace the default authorization mode (AlwaysAllow).
func startAPIServer(ctx context.Context, dir, etcdURL string, authzModes []string) (_ *apiServer, finalErr error) {
	certDir := filepath.Join(dir, "apiserver")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, err
	}
	saKey, err := writeServiceAccountKey(certDir)
	if err != nil {
		return nil, err
	}
	kubeletCA, err := newKubeletCA(certDir)
	if err != nil {
		return nil, err
	}

	s := options.NewServerRunOptions()
	// A registry of its own per server, as the test server does: the
	// process-wide default registry refuses a second registration, and
	// the local cluster may start twice in one process.
	featureGate := utilfeature.DefaultMutableFeatureGate.DeepCopy()
	buildVersion := compatibility.DefaultBuildEffectiveVersion()
	buildVersion.SetEmulationVersion(featureGate.EmulationVersion())
	buildVersion.SetMinCompatibilityVersion(featureGate.MinCompatibilityVersion())
	// /version serves what the effective version says; without the
	// -ldflags of Kubernetes' own builds that is a placeholder kubectl
	// cannot parse.
	kubeVersion, err := KubernetesVersion()
	if err != nil {
		return nil, err
	}
	effectiveVersion, err := newServedVersion(buildVersion, kubeVersion)
	if err != nil {
		return nil, err
	}
	registry := basecompatibility.NewComponentGlobalsRegistry()
	if err := registry.Register(basecompatibility.DefaultKubeComponent, effectiveVersion, featureGate); err != nil {
		return nil, err
	}
	if err := registry.Set(); err != nil {
		return nil, err
	}
	s.GenericServerRunOptions.ComponentGlobalsRegistry = registry

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen: %w", err)
	}
	s.SecureServing.Listener = ln
	s.SecureServing.BindPort = ln.Addr().(*net.TCPAddr).Port
	s.SecureServing.ServerCert.CertDirectory = certDir
	s.SecureServing.ExternalAddress = net.IPv4(127, 0, 0, 1)
	s.ServiceClusterIPRanges = "10.0.0.0/16"
	s.EndpointReconcilerType = "none"

	storage := storagebackend.NewDefaultConfig("/"+uuid.NewString()+"/registry", nil)
	storage.Transport.ServerList = []string{etcdURL}
	s.Etcd.StorageConfig = *storage

	s.ServiceAccountSigningKeyFile = saKey
	s.Authentication.ServiceAccounts.Issuers = []string{"https://localcluster.gpudra.invalid"}
	s.Authentication.ServiceAccounts.KeyFiles = []string{saKey}
	// TaintNodesByCondition puts node.kubernetes.io/not-ready on every new
	// Node, and only the node-lifecycle controller takes it off again; the
	// local cluster runs no node-lifecycle controller (its nodes never
	// stop heartbeating), so the plugin is off.
	s.Admission.GenericAdmission.DisablePlugins = []string{"TaintNodesByCondition"}
	if len(authzModes) > 0 {
		s.Authorization.Modes = slices.Clone(authzModes)
	}
	// As on the clusters gpudra is installed on (kubeadm and most
	// distributions set it): the kubelet plugin's DaemonSet is privileged,
	// and the chart's tests install it here.
	s.AllowPrivileged = true
	// Beta API group versions are served only when asked for; an enabled
	// gate whose API is in one asks for it, as --runtime-config would.
	s.APIEnablement.RuntimeConfig = runtimeConfigOf(featureGate)
	// The kubelet API (logs, exec, port-forward) of the simulated nodes:
	// each serves it on loopback with a certificate of kubeletCA, and its
	// Node names InternalIP 127.0.0.1 beside its Hostname, which no DNS
	// resolves; the default order would try the Hostname first.
	s.KubeletConfig.PreferredAddressTypes = []string{string(corev1.NodeInternalIP), string(corev1.NodeHostName)}
	s.KubeletConfig.TLSClientConfig.CAFile = filepath.Join(certDir, kubeletCAFile)

	completed, err := s.Complete(ctx)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("complete kube-apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		ln.Close()
		return nil, fmt.Errorf("validate kube-apiserver options: %v", errs)
	}
	routes := &serviceRoutes{routes: map[string]string{}}
	config, err := withServiceResolver(routes, func() (*app.Config, error) { return app.NewConfig(completed) })
	if err != nil {
		ln.Close()
		return nil, err
	}
	// The real nodes' kubelets listen on loopback (see dialKubelet).
	config.KubeAPIs.Extra.KubeletClientConfig.Lookup = kubeletLookup
	// Every request passes the aggregator's handler chain first; the
	// counter goes innermost in it, where the verb, resource and user
	// are known.
	requests := newRequestCounter()
	buildChain := config.Aggregator.GenericConfig.BuildHandlerChainFunc
	config.Aggregator.GenericConfig.BuildHandlerChainFunc = func(apiHandler http.Handler, c *genericapiserver.Config) http.Handler {
		return buildChain(requests.wrap(apiHandler), c)
	}
	completedConfig, err := config.Complete()
	if err != nil {
		ln.Close()
		return nil, err
	}
	server, err := app.CreateServerChain(completedConfig)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("create kube-apiserver: %w", err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		defer close(done)
		prepared, err := server.PrepareRun()
		if err != nil {
			done <- err
			return
		}
		done <- prepared.Run(runCtx)
	}()
	a := &apiServer{done: done, cancel: cancel, requests: requests, kubeletCA: kubeletCA, routes: routes}
	defer func() {
		if finalErr != nil {
			// The start's error is the one to report.
			_ = a.stop()
		}
	}()

	a.config = rest.CopyConfig(server.GenericAPIServer.LoopbackClientConfig)
	client, err := kubernetes.NewForConfig(a.config)
	if err != nil {
		return nil, err
	}
	// Ready means healthy and the default namespace created.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-done:
			return false, fmt.Errorf("kube-apiserver stopped: %w", err)
		default:
		}
		status := 0
		client.CoreV1().RESTClient().Get().AbsPath("/healthz").Do(ctx).StatusCode(&status)
		if status != 200 {
			return false, nil
		}
		_, err := client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceDefault, metav1.GetOptions{})
		return err == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("wait for kube-apiserver: %w", err)
	}
	return a, nil
}

// stop stops the server and waits until it has shut down.
func (a *apiServer) stop() error {
	a.cancel()
	return <-a.done
}

// writeServiceAccountKey writes a fresh ECDSA key that signs service
// account tokens.
func writeServiceAccountKey(dir string) (string, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, "sa.key")
	return path, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}
