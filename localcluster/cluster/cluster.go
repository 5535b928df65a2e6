// Package cluster is the local cluster: an in-process control plane (see
// package controlplane), gpudra's DeviceClasses, and one simulated node
// (see package simnode) per node of a simulated fleet.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/computedomain"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"

	"github.com/gpudra/gpudra/localcluster/controlplane"
	"github.com/gpudra/gpudra/localcluster/install"
	"github.com/gpudra/gpudra/localcluster/manifests"
	"github.com/gpudra/gpudra/localcluster/realnode/node"
	"github.com/gpudra/gpudra/localcluster/simnic"
	"github.com/gpudra/gpudra/localcluster/simnode"
)

// DefaultDriverName is gpudra's default DRA driver name.
const DefaultDriverName = v1beta1.GPUDriverName

// Options configure a local cluster.
type Options struct {
	// Fleet is the simulated hardware; required.
	Fleet *simfleet.Fleet
	// DriverName defaults to DefaultDriverName.
	DriverName string
	// Dir holds all state. Empty: a new temporary directory, removed by
	// Stop.
	Dir string
	// ControlPlane configures the control plane; its Dir is set here.
	ControlPlane controlplane.Options
	// NodeQPS and NodeBurst limit each node's clients (its kubelet parts
	// and its plugin each have one). Default 100 and 200.
	NodeQPS   float32
	NodeBurst int
	// NodeWorkers is the number of pods each node handles at once
	// (default simnode.DefaultWorkers).
	NodeWorkers int
	// Progress, if set, gets one line per step of the start.
	Progress func(msg string)
	// MPSControlBinary is the nvidia-cuda-mps-control the nodes run MPS
	// daemons with. Empty: a fake (package mpsfake) that Start installs
	// as links to the running program, which must call [Main] first, and
	// Stop removes, killing the daemons left. A test that checks what is
	// left after the stop installs its own ([FakeMPS]).
	MPSControlBinary string
	// IMEXBinary is the nvidia-imex, with nvidia-imex-ctl beside it, that
	// every node's channel plugin must supervise: the chart's
	// computeDomains.kubeletPlugin.imex daemon, binary and ctl values,
	// where ChartValues do not set them. Empty: where the chart's
	// ComputeDomain driver runs, a fake (package imexfake) that Start
	// installs and Stop removes as it does the MPS fake ([FakeIMEX]).
	IMEXBinary string
	// NoDaemons leaves the daemon binaries above empty when they are:
	// the nodes then refuse MPS claims and the channel plugins, finding
	// no daemon binary, serve channels only. The load run measures the
	// drivers so, without a program to start per MPS claim.
	NoDaemons bool
	// ChartValues are the values gpudra's Helm chart is installed with
	// (helm install -f), over the chart's values.yaml; driverName is
	// DriverName unless they set it.
	ChartValues map[string]any
	// ChartNamespace is the release's namespace (default "gpudra").
	ChartNamespace string
	// BeforeChart, if set, may change the rendered chart before anything
	// of it is applied or run (tests take a verb out of a role with it).
	BeforeChart func(*install.Release) error
	// ComputeDomains installs the chart's ComputeDomain driver
	// (computeDomains.enabled) even when no node of the fleet is in an
	// NVLink clique; with one it is installed anyway. ChartValues that set
	// computeDomains.enabled decide instead.
	ComputeDomains bool
	// Baseline, if set, is the driver name of the baseline driver every
	// DRA node runs beside gpudra (simnode.Config.Baseline).
	Baseline string
	// RealNodes, if set, make the first fleet nodes real nodes (see
	// [RealNodes]); the others stay simulated.
	RealNodes *RealNodes
}

// Cluster is a running local cluster.
type Cluster struct {
	opts   Options
	dir    string
	ownDir bool
	cp     *controlplane.ControlPlane
	client kubernetes.Interface
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
	nodes  []*simnode.Node
	// release is the chart as installed; webhook its webhook's pod.
	release *install.Release
	webhook *webhookPod
	// computeDomains is the chart's ComputeDomain driver, nil when the
	// chart was installed without it.
	computeDomains *computeDomains
	// health injects health events into every node's simulated GPUs.
	health *sim.HealthEvents
	// kubeletVersion is what the Nodes report: the control plane's
	// Kubernetes version, marked as simulated.
	kubeletVersion string
	// chartValues are the values the chart was installed with.
	chartValues map[string]any
	// real are the real nodes, the fleet's first; realEndpoints their
	// plugins' HTTP endpoints by node name.
	real          []*node.Node
	realEndpoints map[string]string
	// realNodesDropped says why the cluster runs without the real nodes
	// the options asked for; empty when it runs with them.
	realNodesDropped string
	// evictions keeps the pods controllers evicted, for the report.
	evictions *evictions
	// removeFakes remove the fake daemons Start installed.
	removeFakes []func()
}

// Start brings the cluster up: the fake MPS and IMEX daemons the options
// leave to it, control plane, gpudra's chart, then all nodes in parallel.
// It returns once every node's plugin is registered and its
// ResourceSlices published. On an error it stops what it started.
//
// Real nodes without binaries get them built first (minutes when cold).
// With [RealNodes.FallBack], a machine that cannot run them, or a cluster
// that does not start with them, gets a cluster of simulated nodes only:
// Progress says why, and so does [Cluster.RealNodesDropped].
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if opts.Fleet == nil || len(opts.Fleet.Nodes) == 0 {
		return nil, errors.New("local cluster: a fleet with at least one node is required")
	}
	if opts.RealNodes != nil {
		if err := opts.RealNodes.validate(opts.Fleet); err != nil {
			return nil, err
		}
	}
	rn := opts.RealNodes
	if rn == nil || rn.Count == 0 {
		return start(ctx, opts)
	}
	progress := opts.Progress
	if progress == nil {
		progress = func(string) {}
	}
	want := *rn // the caller's stay as they were
	opts.RealNodes = &want
	dropped := want.buildBinaries(ctx, progress)
	if dropped == nil {
		c, err := start(ctx, opts)
		if err == nil || !want.FallBack || ctx.Err() != nil {
			return c, err
		}
		// A real node depends on the machine in more ways than
		// realNodeMachine can check; the simulated cluster does not.
		dropped = fmt.Errorf("the cluster did not start with them: %w", err)
	} else if !want.FallBack || ctx.Err() != nil {
		return nil, dropped
	}
	progress(fmt.Sprintf("real nodes: none (%v); the cluster runs with simulated nodes only", dropped))
	opts.RealNodes = nil
	c, err := start(ctx, opts)
	if err != nil {
		return nil, err
	}
	c.realNodesDropped = dropped.Error()
	return c, nil
}

// start is Start with the real nodes' binaries at hand.
func start(ctx context.Context, opts Options) (_ *Cluster, finalErr error) {
	if opts.DriverName == "" {
		opts.DriverName = DefaultDriverName
	}
	if opts.NodeQPS == 0 {
		opts.NodeQPS, opts.NodeBurst = 100, 200
	}
	if opts.NodeWorkers <= 0 {
		opts.NodeWorkers = simnode.DefaultWorkers
	}
	progress := opts.Progress
	if progress == nil {
		progress = func(string) {}
	}
	c := &Cluster{opts: opts, dir: opts.Dir, health: &sim.HealthEvents{}}
	if c.dir == "" {
		// Short: unix socket paths below it must fit in 108 bytes.
		dir, err := os.MkdirTemp("", "gpudra-sim-")
		if err != nil {
			return nil, err
		}
		c.dir, c.ownDir = dir, true
	}
	defer func() {
		if finalErr != nil {
			_ = c.Stop()
		}
	}()

	if err := c.setUpDaemons(); err != nil {
		return nil, err
	}

	cpOpts := opts.ControlPlane
	cpOpts.Dir = filepath.Join(c.dir, "cp")
	if opts.RealNodes != nil && opts.RealNodes.Count > 0 {
		cpOpts.DaemonSets = true
	}
	if cpOpts.AuthorizationModes == nil {
		// As on a real cluster: the plugins run as gpudra's ServiceAccount
		// with only the permissions deployments/rbac grants.
		cpOpts.AuthorizationModes = []string{"Node", "RBAC"}
	}
	if err := os.MkdirAll(cpOpts.Dir, 0o700); err != nil {
		return nil, err
	}
	userProgress := cpOpts.Progress
	cpOpts.Progress = func(component string, took time.Duration) {
		progress(fmt.Sprintf("%-24s ready in %v", component, took.Round(time.Millisecond)))
		if userProgress != nil {
			userProgress(component, took)
		}
	}
	var err error
	if c.cp, err = controlplane.Start(ctx, cpOpts); err != nil {
		return nil, err
	}
	adminCfg := c.cp.RESTConfig("gpudra-sim", 200, 400)
	if c.client, err = kubernetes.NewForConfig(adminCfg); err != nil {
		return nil, err
	}
	if c.dyn, err = dynamic.NewForConfig(adminCfg); err != nil {
		return nil, err
	}
	disc, err := discovery.NewDiscoveryClientForConfig(adminCfg)
	if err != nil {
		return nil, err
	}
	c.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	if err := c.startEvictions(ctx); err != nil {
		return nil, err
	}

	if err := c.installChart(ctx, progress); err != nil {
		return nil, err
	}
	if err := c.installNICClass(ctx); err != nil {
		return nil, err
	}

	kubeVersion, err := controlplane.KubernetesVersion()
	if err != nil {
		return nil, err
	}
	c.kubeletVersion = kubeVersion + "-gpudra-sim"
	start := time.Now()
	if err := c.startNodes(ctx); err != nil {
		return nil, err
	}
	progress(fmt.Sprintf("%-24s ready in %v", fmt.Sprintf("%d simulated nodes", len(c.nodes)), time.Since(start).Round(time.Millisecond)))
	if err := c.startRealNodes(ctx, progress); err != nil {
		return nil, err
	}
	if c.release.ComputeDomainController != nil {
		if err := c.startComputeDomains(ctx, progress); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// startNodes starts every simulated node of the fleet (all but the real
// ones), a few at a time.
func (c *Cluster) startNodes(ctx context.Context) error {
	fleet := c.opts.Fleet
	nodes := make([]*simnode.Node, len(fleet.Nodes))
	errs := make([]error, len(fleet.Nodes))
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := c.realNodeCount(); i < len(fleet.Nodes); i++ {
		name := fleet.Nodes[i].Name
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			nodes[i], errs[i] = c.startNode(ctx, i, name)
		})
	}
	wg.Wait()
	for _, n := range nodes {
		if n != nil {
			c.nodes = append(c.nodes, n)
		}
	}
	return errors.Join(errs...)
}

func (c *Cluster) startNode(ctx context.Context, index int, name string) (*simnode.Node, error) {
	fn, err := c.opts.Fleet.Node(name)
	if err != nil {
		return nil, err
	}
	kubeletTLS, err := c.cp.KubeletServerTLS(name)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	kubelet, err := kubernetes.NewForConfig(c.cp.RESTConfig("kubelet/"+name, c.opts.NodeQPS, c.opts.NodeBurst))
	if err != nil {
		return nil, err
	}
	// The plugin runs as the chart's DaemonSet's ServiceAccount, with the
	// node name its pod-bound token carries: the status.devices permission
	// and the ResourceSlice policy depend on it.
	pod := c.release.KubeletPlugin
	pluginCfg := c.cp.RESTConfig("gpudra-kubelet-plugin/"+name, c.opts.NodeQPS, c.opts.NodeBurst)
	pluginCfg.Impersonate = serviceAccountIdentity(pod.Namespace, pod.ServiceAccount(), name)
	nodeDir := c.nodeDir(index)
	sysfs, err := fn.Sysfs()
	if err != nil {
		return nil, err
	}
	sharing, err := fn.GPUSharing()
	if err != nil {
		return nil, err
	}
	dpConfig, err := fn.DevicePluginConfig()
	if err != nil {
		return nil, fmt.Errorf("node %s: devicePlugin: %w", name, err)
	}
	return simnode.Start(klog.NewContext(ctx, klog.FromContext(ctx)), simnode.Config{
		Sysfs:            sysfs,
		Sharing:          sharing,
		Name:             name,
		DriverName:       c.opts.DriverName,
		Hardware:         fn.Hardware(sim.WithHealthEvents(c.health)),
		Dir:              nodeDir,
		KubeletClient:    kubelet,
		PluginRESTConfig: pluginCfg,
		PluginArgs: func(podUID string) ([]string, error) {
			return pod.Args(install.Instance{NodeName: name, UID: podUID, Volume: nodeVolumes(nodeDir, c.opts.DriverName)})
		},
		Workers:          c.opts.NodeWorkers,
		MIGMode:          draplugin.MIGMode(fn.MIGMode),
		MIGModeSwitching: fn.MIGModeSwitching,
		Mode:             fn.Mode,
		DevicePlugin:     dpConfig,
		NICs:             fn.NICs,

		MPSControlBinary: c.opts.MPSControlBinary,
		KubeletTLS:       kubeletTLS,
		KubeletVersion:   c.kubeletVersion,
		Baseline:         c.opts.Baseline,
		Labels:           cliqueLabel(fn),
	})
}

// CliqueLabel is the Node label GPU Feature Discovery sets on a node of a
// multi-node NVLink clique: <fabric cluster UUID>.<clique ID>. Workloads
// of a ComputeDomain select such nodes by it (examples/compute-domain).
const CliqueLabel = "nvidia.com/gpu.clique"

// cliqueLabel returns the node's CliqueLabel, as GPU Feature Discovery
// would set it: only where the fabric registration completed without
// error.
func cliqueLabel(fn *simfleet.Node) map[string]string {
	f := fn.Fabric
	if f == nil || (f.State != "" && f.State != string(hardware.FabricCompleted)) || f.Status != "" {
		return nil
	}
	uuid := f.ClusterUUID
	if uuid == "" {
		uuid = sim.DefaultClusterUUID
	}
	return map[string]string{CliqueLabel: fmt.Sprintf("%s.%d", uuid, f.CliqueID)}
}

// installNICClass creates the simulated NIC driver's DeviceClass when a
// node of the fleet has NICs: the class a network driver's chart would
// install, as gpudra's installs gpu.nvidia.com.
func (c *Cluster) installNICClass(ctx context.Context) error {
	if !slices.ContainsFunc(c.opts.Fleet.Nodes, func(n simfleet.Node) bool { return len(n.NICs) > 0 }) {
		return nil
	}
	class := simnic.DeviceClass(simnic.DefaultDriverName)
	if _, err := c.client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("install DeviceClass %s: %w", class.Name, err)
	}
	return nil
}

// nodeDir returns the directory of the node with the given index: short,
// for unix socket paths below it must fit in 108 bytes with the NUL. One
// length is avoided: kubeletplugin v0.37.1 names the registration socket
// of a plugin with --pod-uid <driver>-<pod UID>-reg.sock when that path
// is at most 108 bytes long, one more than fits, and the plugin then fails
// to listen; a byte longer, it takes a hashed name that fits.
func (c *Cluster) nodeDir(index int) string {
	dir := filepath.Join(c.dir, "n", strconv.Itoa(index))
	// The channel plugin registers in the same directory.
	for c.registrationSocketIs108(dir) {
		dir += "_"
	}
	return dir
}

// registrationSocketIs108 reports whether the registration socket of one
// of the node's plugins (with --pod-uid) is 108 bytes long under dir.
func (c *Cluster) registrationSocketIs108(dir string) bool {
	for _, driver := range []string{c.opts.DriverName, computedomain.DriverName} {
		if len(filepath.Join(dir, "plugins_registry", driver+"-"+strings.Repeat("0", simnode.PodUIDLength)+"-reg.sock")) == 108 {
			return true
		}
	}
	return false
}

// Options returns the options in effect, defaults filled in.
func (c *Cluster) Options() Options { return c.opts }

// InjectHealth makes a health event happen to the GPU with NVML index gpu
// on the named node (see sim.HealthEvents.Inject). An XID or ECC event
// that the node's plugin was not watching for returns an error wrapping
// sim.ErrNotWatched.
func (c *Cluster) InjectHealth(node string, gpu int, e sim.HealthEvent) error {
	if c.SimNode(node) == nil {
		return fmt.Errorf("inject %s: no node %q in the cluster", e, node)
	}
	return c.health.Inject(node, gpu, e)
}

// HealthWatched reports whether the named node's plugin watches the health
// of its GPU with NVML index gpu (and those before it).
func (c *Cluster) HealthWatched(node string, gpu int) bool { return c.health.Watched(node, gpu) }

// Client returns an administrator's client.
func (c *Cluster) Client() kubernetes.Interface { return c.client }

// ControlPlane returns the control plane.
func (c *Cluster) ControlPlane() *controlplane.ControlPlane { return c.cp }

// SimNodes returns the simulated nodes in fleet order.
func (c *Cluster) SimNodes() []*simnode.Node { return c.nodes }

// SimNode returns the simulated node called name, or nil.
func (c *Cluster) SimNode(name string) *simnode.Node {
	for _, n := range c.nodes {
		if n.Name() == name {
			return n
		}
	}
	return nil
}

// Apply creates the objects in dependency order and returns those that
// were refused, each with the API server's reason; the others are
// created all the same. Before the first object of a namespace it waits
// for the namespace's default ServiceAccount, as pods are refused until
// the controller has made it; for a namespace that does not exist it does
// not wait, and the API server refuses the objects, naming it. The error
// is ctx's.
func (c *Cluster) Apply(ctx context.Context, objs []manifests.Object) ([]manifests.Refusal, error) {
	a := &manifests.Applier{
		Client: c.dyn,
		Mapper: c.mapper,
		BeforeNamespaced: func(ctx context.Context, ns string) error {
			return wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				if _, err := c.client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err == nil {
					return true, nil
				}
				_, err := c.client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
				return apierrors.IsNotFound(err), nil
			})
		},
	}
	return a.Apply(ctx, objs)
}

// Stop stops the ComputeDomain driver, the nodes, then the control
// plane, removes the fake daemons Start installed (killing those still
// running), and removes the directory if Start made it.
func (c *Cluster) Stop() error {
	var errs []error
	if c.computeDomains != nil {
		errs = append(errs, c.computeDomains.stop())
		c.computeDomains = nil
	}
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Go(n.Stop)
	}
	wg.Wait()
	c.nodes = nil
	errs = append(errs, c.stopRealNodes(context.Background()))
	if c.evictions != nil {
		c.evictions.stop()
		c.evictions = nil
	}
	if c.webhook != nil {
		errs = append(errs, c.webhook.stop())
		c.webhook = nil
	}
	if c.cp != nil {
		errs = append(errs, c.cp.Stop())
		c.cp = nil
	}
	c.removeDaemons()
	if c.ownDir {
		errs = append(errs, os.RemoveAll(c.dir))
		c.ownDir = false
	}
	return errors.Join(errs...)
}
