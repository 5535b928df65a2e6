// Package chaosreal runs gpudra's chaos trials (internal/chaos of the
// driver module) against the local cluster's real etcd and kube-apiserver
// instead of the driver module's small in-repo API server: the plugin
// process reaches kube-apiserver through the trial's cutting proxy (TCP,
// so TLS passes through), and every write, the plugin's ResourceSlices
// and claim status and the harness's claims, allocations and pods, is
// validated and admitted as in a cluster. One control plane serves every
// trial of a run; each trial leaves it without its objects.
package chaosreal

import (
	"context"
	"fmt"
	"net/url"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/gpudra/gpudra/internal/chaos"
	"github.com/gpudra/gpudra/localcluster/controlplane"
)

// Names the trials use (internal/chaos's node and namespace).
const (
	nodeName  = "chaos-0"
	namespace = metav1.NamespaceDefault
)

// Server is a control plane shared by the trials of a run.
type Server struct {
	cp     *controlplane.ControlPlane
	client kubernetes.Interface
}

// Start starts the control plane: etcd, kube-apiserver, its controllers
// (the resource-claim controller among them acts on the trials' claims)
// and kube-scheduler (idle: the trials' pods are bound when created).
func Start(ctx context.Context) (*Server, error) {
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cp.RESTConfig("gpudra-chaos-cleanup", 500, 1000))
	if err != nil {
		_ = cp.Stop()
		return nil, err
	}
	return &Server{cp: cp, client: client}, nil
}

// Stop stops the control plane.
func (s *Server) Stop() error { return s.cp.Stop() }

// Factory gives each trial the shared API server.
func (s *Server) Factory() chaos.APIServerFactory {
	return func(ctx context.Context) (chaos.APIServer, error) {
		// A trial that failed before its Close may have left objects.
		if err := s.clean(ctx); err != nil {
			return nil, err
		}
		return trialServer{s}, nil
	}
}

// SetUp is chaos.Main's set-up for a run against the control plane.
func SetUp(ctx context.Context, _ *chaos.Options) (chaos.APIServerFactory, func() error, error) {
	s, err := Start(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("start the control plane: %w", err)
	}
	return s.Factory(), s.Stop, nil
}

// trialServer is the control plane as one trial sees it.
type trialServer struct{ s *Server }

// Addr implements [chaos.APIServer].
func (t trialServer) Addr() string {
	u, err := url.Parse(t.s.cp.RESTConfig("addr", 1, 1).Host)
	if err != nil {
		return "" // the proxy's dials fail, and the trial with them
	}
	return u.Host
}

// WriteKubeconfig implements [chaos.APIServer]: the administrator's
// credentials, and the server name of the API server's certificate,
// which the proxy's address is not.
func (t trialServer) WriteKubeconfig(path, addr string) error {
	cfg := t.s.cp.RESTConfig("kubeconfig", 1, 1)
	kc := clientcmdapi.NewConfig()
	kc.Clusters["chaos"] = &clientcmdapi.Cluster{
		Server:                   "https://" + addr,
		CertificateAuthorityData: cfg.CAData,
		TLSServerName:            cfg.ServerName,
	}
	kc.AuthInfos["chaos"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["chaos"] = &clientcmdapi.Context{Cluster: "chaos", AuthInfo: "chaos"}
	kc.CurrentContext = "chaos"
	return clientcmd.WriteToFile(*kc, path)
}

// RESTConfig implements [chaos.APIServer].
func (t trialServer) RESTConfig() *rest.Config {
	return t.s.cp.RESTConfig("gpudra-chaos-harness", 1000, 2000)
}

// Close implements [chaos.APIServer]: the trial's pods, claims and
// ResourceSlices go; the Node stays for the next trial.
func (t trialServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return t.s.clean(ctx)
}

// clean deletes the trials' pods, claims and the node's ResourceSlices and
// waits until they are gone.
func (s *Server) clean(ctx context.Context) error {
	force := metav1.DeleteOptions{GracePeriodSeconds: new(int64)}
	slices := metav1.ListOptions{FieldSelector: "spec.nodeName=" + nodeName}
	if err := s.client.CoreV1().Pods(namespace).DeleteCollection(ctx, force, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete pods: %w", err)
	}
	if err := s.client.ResourceV1().ResourceClaims(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete claims: %w", err)
	}
	if err := s.client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, slices); err != nil {
		return fmt.Errorf("delete slices: %w", err)
	}
	var left string
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		pods, err := s.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		claims, err := s.client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		sl, err := s.client.ResourceV1().ResourceSlices().List(ctx, slices)
		if err != nil {
			return false, nil
		}
		left = fmt.Sprintf("%d pods, %d claims, %d slices", len(pods.Items), len(claims.Items), len(sl.Items))
		return len(pods.Items)+len(claims.Items)+len(sl.Items) == 0, nil
	})
	if err != nil {
		return fmt.Errorf("the trial's objects are not gone (%s): %w", left, err)
	}
	return nil
}
