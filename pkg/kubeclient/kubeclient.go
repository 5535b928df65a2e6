// Package kubeclient holds the API client flags of the gpudra commands that
// talk to the API server (kubelet-plugin, compute-domain-kubelet-plugin,
// compute-domain-controller) and the client configuration they give.
package kubeclient

import (
	"fmt"
	"os"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpudra/gpudra/pkg/version"
)

// Client rate limits. The kubeletplugin helper GETs every claim of every
// NodePrepareResources call from the API server; at client-go's default of
// 5 requests/s a node starting 32 pods would wait seconds for its own
// client. 50/s sustained with a burst of 100 lets a full node's pods start
// at once, and stays small next to the kubelet's own API traffic.
const (
	DefaultKubeAPIQPS   = 50
	DefaultKubeAPIBurst = 100
)

// Flags are --kubeconfig, --kube-api-qps and --kube-api-burst. Commands
// embed them, so their fields read as the command's own.
type Flags struct {
	// Kubeconfig is the kubeconfig file; empty means the in-cluster
	// config.
	Kubeconfig string
	// KubeAPIQPS and KubeAPIBurst are client-go's rate limits.
	KubeAPIQPS   float32
	KubeAPIBurst int
}

// AddFlags adds the flags to fs, with $KUBECONFIG and the default limits
// as defaults.
func (f *Flags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.Kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file; in-cluster config when empty (env KUBECONFIG)")
	fs.Float32Var(&f.KubeAPIQPS, "kube-api-qps", DefaultKubeAPIQPS, "sustained requests per second to the API server")
	fs.IntVar(&f.KubeAPIBurst, "kube-api-burst", DefaultKubeAPIBurst, "burst of requests to the API server")
}

// Validate checks the rate limits: client-go takes a QPS of 0 for its own
// default and a negative one for no limit, neither of which a flag should
// mean silently.
func (f *Flags) Validate() error {
	if !(f.KubeAPIQPS > 0) {
		return fmt.Errorf("--kube-api-qps %v: must be more than 0", f.KubeAPIQPS)
	}
	if f.KubeAPIBurst < 1 {
		return fmt.Errorf("--kube-api-burst %d: must be 1 or more", f.KubeAPIBurst)
	}
	return nil
}

// RESTConfig is the client configuration of the flags, for component (a
// gpudra command), which names it in the user agent.
func (f *Flags) RESTConfig(component string) (*rest.Config, error) {
	cfg, err := Config(f.Kubeconfig, component)
	if err != nil {
		return nil, err
	}
	cfg.QPS = f.KubeAPIQPS
	cfg.Burst = f.KubeAPIBurst
	return cfg, nil
}

// Config is the client configuration of a kubeconfig file (the in-cluster
// configuration when empty) for component, with client-go's default rate
// limits: for commands without the rate-limit flags (the webhook).
func Config(kubeconfig, component string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("API client config (--kubeconfig %q): %w", kubeconfig, err)
	}
	cfg.UserAgent = "gpudra-" + component + "/" + version.Get().UserAgentVersion()
	return cfg, nil
}
