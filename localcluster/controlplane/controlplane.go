// Package controlplane runs a Kubernetes control plane in one process, on
// loopback only: embedded etcd, kube-apiserver, kube-scheduler and the
// kube-controller-manager controllers that ordinary manifests need
// (resource-claim, namespace, deployment, replicaset, job, statefulset,
// garbage collector, service account, root CA publisher, and with
// Options.DaemonSets the daemonset controller). Everything is built from
// the upstream Go modules; nothing is downloaded or executed.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"

	"go.etcd.io/etcd/server/v3/embed"
)

// Options configure a control plane. The zero value is usable.
type Options struct {
	// Dir holds etcd's data, certificates and the kubeconfig. Empty: a
	// new temporary directory, removed by Stop.
	Dir string
	// SchedulerQPS and SchedulerBurst limit kube-scheduler's client.
	SchedulerQPS   float32
	SchedulerBurst int
	// ControllerQPS and ControllerBurst limit the controllers' client.
	ControllerQPS   float32
	ControllerBurst int
	// Progress, if set, is told about each component as it comes up.
	Progress func(component string, took time.Duration)
	// AuthorizationModes are kube-apiserver's --authorization-mode values,
	// e.g. {"Node", "RBAC"} for tests of the RBAC gpudra ships. Empty:
	// AlwaysAllow, as before; the control plane's own components use a
	// privileged loopback token, so they work under any mode.
	AuthorizationModes []string
	// DaemonSets runs the daemonset controller: a cluster with real nodes
	// (package realnode) runs gpudra's DaemonSet through it. Off, a
	// DaemonSet is stored and nothing makes its pods, as before real
	// nodes: the simulated nodes run the chart's DaemonSet's pod in
	// process, and another DaemonSet's pods would land on all of them.
	DaemonSets bool
	// KubernetesVersion is the minor version ("1.34") every component of
	// the process behaves as, through Kubernetes' compatibility-version
	// emulation: the API server serves that version's APIs and drops the
	// fields of features off there, and the scheduler, the controllers and
	// the simulated kubelets take that version's feature-gate defaults.
	// VersionRange gives what this build reaches. Empty: the build's own
	// version. The version is process-wide (see emulate).
	KubernetesVersion string
	// FeatureGates override feature gates at that version, as
	// --feature-gates does on every component. Process-wide too.
	FeatureGates map[string]bool
}

// Default client limits. kube-scheduler's and kube-controller-manager's
// own defaults (50/100 and 20/30) would cap a load run far below what one
// API server on loopback serves.
const (
	DefaultSchedulerQPS    = 500
	DefaultSchedulerBurst  = 1000
	DefaultControllerQPS   = 500
	DefaultControllerBurst = 1000
)

// ControlPlane is a running control plane.
type ControlPlane struct {
	opts       Options
	dir        string
	ownDir     bool
	etcd       *embed.Etcd
	api        *apiServer
	sched      *scheduler
	ctrl       *controllers
	kubeconfig string
	// listening are the loopback addresses the control plane listens on.
	listening []string
	// release gives back the process-wide emulation at Stop.
	release func()
	// version is the emulated minor version, e.g. "1.34".
	version string
}

// Start brings up etcd, kube-apiserver, kube-scheduler and the controllers
// and returns once pods can be created in the default namespace (its
// default ServiceAccount exists) and the scheduler's caches are synced.
// The components run until Stop; ctx only bounds the start.
func Start(ctx context.Context, opts Options) (_ *ControlPlane, finalErr error) {
	opts.defaults()
	c := &ControlPlane{opts: opts, dir: opts.Dir}
	release, err := emulate(opts.KubernetesVersion, opts.FeatureGates)
	if err != nil {
		return nil, err
	}
	c.release = release
	if c.version, err = ParseKubernetesVersion(opts.KubernetesVersion); err != nil {
		release()
		return nil, err
	}
	if c.dir == "" {
		dir, err := os.MkdirTemp("", "localcluster-")
		if err != nil {
			release()
			return nil, err
		}
		c.dir, c.ownDir = dir, true
	}
	defer func() {
		if finalErr != nil {
			_ = c.Stop()
		}
	}()
	// The components outlive ctx: they stop in Stop, in order.
	runCtx := context.WithoutCancel(ctx)

	step := func(name string, f func() error) error {
		start := time.Now()
		if err := f(); err != nil {
			return fmt.Errorf("start %s: %w", name, err)
		}
		if opts.Progress != nil {
			opts.Progress(name, time.Since(start))
		}
		return nil
	}
	var etcdURL string
	if err := step("etcd", func() (err error) {
		c.etcd, etcdURL, err = startEtcd(c.dir)
		return err
	}); err != nil {
		return nil, err
	}
	for _, l := range c.etcd.Clients {
		c.listening = append(c.listening, l.Addr().String())
	}
	for _, p := range c.etcd.Peers {
		c.listening = append(c.listening, p.Addr().String())
	}
	if err := step("kube-apiserver", func() (err error) {
		c.api, err = startAPIServer(klog.NewContext(runCtx, klog.FromContext(ctx).WithName("kube-apiserver")), c.dir, etcdURL, opts.AuthorizationModes)
		return err
	}); err != nil {
		return nil, err
	}
	c.kubeconfig = filepath.Join(c.dir, "kubeconfig")
	if err := c.WriteKubeconfig(c.kubeconfig); err != nil {
		return nil, err
	}
	if err := step("kube-controller-manager", func() (err error) {
		rootCA, err := os.ReadFile(c.ServingCertFile())
		if err != nil {
			return fmt.Errorf("the API server's serving certificate: %w", err)
		}
		c.ctrl, err = startControllers(runCtx, c.api.config, opts.ControllerQPS, opts.ControllerBurst, rootCA, c.Controllers())
		if err != nil {
			return err
		}
		return c.waitForDefaultServiceAccount(ctx)
	}); err != nil {
		return nil, err
	}
	if err := step("kube-scheduler", func() (err error) {
		c.sched, err = startScheduler(klog.NewContext(runCtx, klog.FromContext(ctx).WithName("kube-scheduler")), c.kubeconfig, opts.SchedulerQPS, opts.SchedulerBurst)
		return err
	}); err != nil {
		return nil, err
	}
	return c, nil
}

func (o *Options) defaults() {
	if o.SchedulerQPS == 0 {
		o.SchedulerQPS, o.SchedulerBurst = DefaultSchedulerQPS, DefaultSchedulerBurst
	}
	if o.ControllerQPS == 0 {
		o.ControllerQPS, o.ControllerBurst = DefaultControllerQPS, DefaultControllerBurst
	}
}

// The ServiceAccount admission plugin rejects pods in a namespace whose
// default ServiceAccount the controller has not created yet.
func (c *ControlPlane) waitForDefaultServiceAccount(ctx context.Context) error {
	client, err := kubernetes.NewForConfig(c.api.config)
	if err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
}

// RESTConfig returns a new copy of the administrator's client config,
// with the given client limits.
func (c *ControlPlane) RESTConfig(userAgent string, qps float32, burst int) *rest.Config {
	cfg := rest.CopyConfig(c.api.config)
	cfg.UserAgent = userAgent
	cfg.QPS, cfg.Burst = qps, burst
	return cfg
}

// Listening returns the loopback addresses (host:port) of etcd's client
// and peer listeners and the kube-apiserver: a stopped control plane must
// leave none of them open.
func (c *ControlPlane) Listening() []string {
	out := slices.Clone(c.listening)
	if u, err := url.Parse(c.RESTConfig("listening", 1, 1).Host); err == nil {
		out = append(out, u.Host)
	}
	return out
}

// ServingCertFile returns the API server's serving certificate (PEM: the
// certificate, then the self-signed authority that signed it), for
// 127.0.0.1, localhost and the kubernetes Service's names and IP. Clients
// outside this process (a real kubelet's pods) trust it as their CA.
func (c *ControlPlane) ServingCertFile() string {
	return filepath.Join(c.dir, "apiserver", "apiserver.crt")
}

// Dir returns the directory holding the control plane's state.
func (c *ControlPlane) Dir() string { return c.dir }

// KubeconfigPath returns the administrator's kubeconfig, written at start.
func (c *ControlPlane) KubeconfigPath() string { return c.kubeconfig }

// KubernetesMinor returns the minor version the control plane behaves as
// ("1.34"): Options.KubernetesVersion, or the build's.
func (c *ControlPlane) KubernetesMinor() string { return c.version }

// Options returns the options in effect, defaults filled in.
func (c *ControlPlane) Options() Options { return c.opts }

// WriteKubeconfig writes a kubeconfig for the administrator to path. The
// API server's certificate is for the name "apiserver-loopback-client",
// which the kubeconfig sets as the TLS server name.
func (c *ControlPlane) WriteKubeconfig(path string) error {
	cfg := c.api.config
	kc := clientcmdapi.NewConfig()
	kc.Clusters["localcluster"] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthorityData: cfg.CAData,
		TLSServerName:            cfg.ServerName,
	}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["localcluster"] = &clientcmdapi.Context{Cluster: "localcluster", AuthInfo: "admin"}
	kc.CurrentContext = "localcluster"
	return clientcmd.WriteToFile(*kc, path)
}

// Stop stops the components in the reverse order of their start and
// removes the directory if Start made it. It waits for each to finish.
func (c *ControlPlane) Stop() error {
	var errs []error
	if c.sched != nil {
		c.sched.stop()
		c.sched = nil
	}
	if c.ctrl != nil {
		c.ctrl.stop()
		c.ctrl = nil
	}
	if c.api != nil {
		if err := c.api.stop(); err != nil {
			errs = append(errs, fmt.Errorf("kube-apiserver: %w", err))
		}
		c.api = nil
	}
	if c.etcd != nil {
		c.etcd.Close()
		c.etcd = nil
	}
	if c.ownDir {
		if err := os.RemoveAll(c.dir); err != nil {
			errs = append(errs, err)
		}
		c.ownDir = false
	}
	if c.release != nil {
		c.release()
		c.release = nil
	}
	return errors.Join(errs...)
}

// RequestCounts returns how many API requests the API server has handled
// since it started, by client component, verb and resource. Take it
// twice and Sub to count the requests of a period.
func (c *ControlPlane) RequestCounts() RequestCounts { return c.api.requests.snapshot() }

// OpenWatches returns the watches the API server is serving now, by
// client component and resource (Verb "watch").
func (c *ControlPlane) OpenWatches() RequestCounts { return c.api.requests.openWatches() }
