package chaos

import (
	"context"

	"k8s.io/client-go/rest"

	"github.com/gpudra/gpudra/internal/chaos/apiserver"
)

// APIServer is the API server a trial's plugin talks to, through the
// trial's cutting proxy, and the harness talks to directly.
type APIServer interface {
	// Addr is the host:port the proxy forwards to. The proxy works on
	// TCP, so a TLS server's handshake passes through it.
	Addr() string
	// WriteKubeconfig writes the plugin's kubeconfig to path: the server
	// reached at addr (the proxy's host:port) with the server's own
	// credentials, scheme and TLS server name.
	WriteKubeconfig(path, addr string) error
	// RESTConfig is the harness's client config, straight to the server.
	RESTConfig() *rest.Config
	// Close ends the trial's use of the server: a server of its own
	// stops; a shared one is left without the trial's objects.
	Close() error
}

// APIServerFactory gives each trial its API server. The trial creates
// its Node (or finds it there), and its claims and pods in namespace
// "default"; Close must leave no ResourceSlice of the node, claim or pod
// behind for the next trial.
type APIServerFactory func(ctx context.Context) (APIServer, error)

// inRepoAPIServer is package apiserver's server, one per trial: the
// default, which needs no kube-apiserver in the driver module.
type inRepoAPIServer struct{ s *apiserver.Server }

func startInRepoAPIServer(context.Context) (APIServer, error) {
	s, err := apiserver.Start()
	if err != nil {
		return nil, err
	}
	return inRepoAPIServer{s}, nil
}

func (a inRepoAPIServer) Addr() string { return a.s.Addr() }

func (a inRepoAPIServer) WriteKubeconfig(path, addr string) error {
	return apiserver.WriteKubeconfig(path, "http://"+addr)
}

func (a inRepoAPIServer) RESTConfig() *rest.Config { return apiserver.RESTConfig(a.s.URL()) }

func (a inRepoAPIServer) Close() error {
	a.s.Close()
	return nil
}
