package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"

	"github.com/gpudra/gpudra/deployments/crds"
	"github.com/gpudra/gpudra/deployments/deviceclasses"
	"github.com/gpudra/gpudra/localcluster/simnode"
	"github.com/gpudra/gpudra/pkg/computedomain"
	"github.com/gpudra/gpudra/pkg/fakeprog"
	"github.com/gpudra/gpudra/pkg/features/imexchannel"
	"github.com/gpudra/gpudra/pkg/imex"
	"github.com/gpudra/gpudra/pkg/imex/imexfake"
	"github.com/gpudra/gpudra/pkg/plugin"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// ComputeDomains is the ComputeDomain stack of a local cluster: the CRDs,
// the DeviceClasses, the controller in process and a channel plugin on
// every node.
type ComputeDomains struct {
	cancel  context.CancelFunc
	done    chan error
	plugins []*plugin.Driver
	nodes   []*simnode.Node
}

// CliqueNamespace is where the local cluster's nodes report their IMEX
// daemons (the driver's namespace).
const CliqueNamespace = "gpudra"

// ComputeDomainOptions configure [Cluster.StartComputeDomainsWith].
type ComputeDomainOptions struct {
	// MaxChannels is the channels handed out; 0 means the default.
	MaxChannels int
	// IMEXBinary, if set, is the nvidia-imex every node's channel plugin
	// supervises (nvidia-imex-ctl beside it; see [FakeIMEX]); empty
	// serves channels only.
	IMEXBinary string
	// IMEXMaxNodes is the peer names per clique; 0 means 18.
	IMEXMaxNodes int
	// IMEXIdleStop is how long a daemon no claim holds runs on; 0 means
	// 2 s, so that a test sees daemons go soon after their last pod.
	IMEXIdleStop time.Duration
}

// StartComputeDomains installs the ComputeDomain CRDs and DeviceClasses,
// starts the controller (maxChannels channels; 0 means the default) and
// the channel plugin on every node, serving channels only. Stop it before
// the cluster.
func (c *Cluster) StartComputeDomains(ctx context.Context, maxChannels int) (*ComputeDomains, error) {
	return c.StartComputeDomainsWith(ctx, ComputeDomainOptions{MaxChannels: maxChannels})
}

// StartComputeDomainsWith is StartComputeDomains with options: with
// IMEXBinary, every node's plugin supervises its IMEX daemon, node i
// reporting IP 127.0.1.<i+1> with ports of its own.
func (c *Cluster) StartComputeDomainsWith(ctx context.Context, o ComputeDomainOptions) (_ *ComputeDomains, finalErr error) {
	maxChannels := o.MaxChannels
	if maxChannels <= 0 {
		maxChannels = imexchannel.DefaultMaxChannels
	}
	for _, name := range []string{"computedomains.resource.nvidia.com", "computedomaincliques.resource.nvidia.com"} {
		data, err := crds.Read(name)
		if err != nil {
			return nil, err
		}
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &obj.Object); err != nil {
			return nil, fmt.Errorf("CRD %s: %w", name, err)
		}
		if _, err := c.dyn.Resource(crdGVR).Create(ctx, obj, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("install CRD %s: %w", name, err)
		}
	}
	// Served once a List works; then the mapper must learn the new kinds.
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.dyn.Resource(computedomain.GVR).List(ctx, metav1.ListOptions{})
		return err == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("ComputeDomain CRD not served: %w", err)
	}
	c.mapper.Reset()
	classes, err := deviceclasses.ComputeDomain()
	if err != nil {
		return nil, err
	}
	for _, class := range classes {
		if _, err := c.client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("install DeviceClass %s: %w", class.Name, err)
		}
	}

	runCtx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.FromContext(ctx)))
	cds := &ComputeDomains{cancel: cancel, done: make(chan error, 1)}
	defer func() {
		if finalErr != nil {
			cds.Stop()
		}
	}()
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: CliqueNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create namespace %s: %w", CliqueNamespace, err)
	}
	ctrl := computedomain.NewController(computedomain.ControllerConfig{KubeClient: c.client, DynamicClient: c.dyn, MaxChannels: maxChannels,
		CliqueNamespace: CliqueNamespace, ChannelDriver: simnode.ComputeDomainDriverName})
	go func() { cds.done <- ctrl.Run(runCtx) }()

	// The plugins read domains with the admin client: the chart's RBAC
	// for the channel plugin is still to be written.
	channels := &computedomain.APIChannels{Client: c.dyn}
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	imexCfgs, err := o.imexConfigs(c)
	if err != nil {
		return nil, err
	}
	for i, n := range c.nodes {
		cds.nodes = append(cds.nodes, n)
		wg.Go(func() {
			d, err := n.StartComputeDomainPlugin(ctx, c.client, channels, imexCfgs[i])
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			cds.plugins = append(cds.plugins, d)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return cds, nil
}

// Stop stops the channel plugins and the controller.
func (s *ComputeDomains) Stop() {
	for _, d := range s.plugins {
		d.Stop()
	}
	s.plugins = nil
	for _, n := range s.nodes {
		n.StopIMEX()
	}
	s.nodes = nil
	if s.cancel != nil {
		s.cancel()
		if err := <-s.done; err != nil && !errors.Is(err, context.Canceled) {
			klog.Background().Error(err, "ComputeDomain controller stopped")
		}
		s.cancel = nil
	}
}

// Dynamic returns the admin's dynamic client, for custom resources such
// as ComputeDomains.
func (c *Cluster) Dynamic() dynamic.Interface { return c.dyn }

// imexConfigs returns each node's IMEX config, all nil without IMEXBinary.
func (o ComputeDomainOptions) imexConfigs(c *Cluster) ([]*simnode.IMEXConfig, error) {
	out := make([]*simnode.IMEXConfig, len(c.nodes))
	if o.IMEXBinary == "" {
		return out, nil
	}
	if len(c.nodes) > 254 {
		return nil, fmt.Errorf("%d nodes: the local cluster's IMEX addresses 127.0.1.1-254 fit 254", len(c.nodes))
	}
	maxNodes := o.IMEXMaxNodes
	if maxNodes <= 0 {
		maxNodes = imex.DefaultMaxNodes
	}
	idle := o.IMEXIdleStop
	if idle <= 0 {
		idle = 2 * time.Second
	}
	for i := range c.nodes {
		ip := fmt.Sprintf("127.0.1.%d", i+1)
		ports, err := freePorts(ip, 2)
		if err != nil {
			return nil, err
		}
		out[i] = &simnode.IMEXConfig{
			Binary: o.IMEXBinary, Ctl: filepath.Join(filepath.Dir(o.IMEXBinary), imex.CtlName),
			Dynamic: c.dyn, Namespace: CliqueNamespace, NodeIP: ip,
			ServerPort: ports[0], CmdPort: ports[1], MaxNodes: maxNodes, IdleStop: idle,
		}
	}
	return out, nil
}

// freePorts returns n TCP ports free on ip now (and on loopback, where the
// fake daemon's query service listens).
func freePorts(ip string, n int) ([]int, error) {
	var out []int
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	for len(out) < n {
		ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			return nil, fmt.Errorf("a free port on %s: %w", ip, err)
		}
		lns = append(lns, ln)
		port := ln.Addr().(*net.TCPAddr).Port
		// The query port listens on 127.0.0.1: it must be free there too.
		lo, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		lns = append(lns, lo)
		out = append(out, port)
	}
	return out, nil
}

// FakeIMEX makes the running program the nvidia-imex and nvidia-imex-ctl
// of the simulated nodes, as [FakeMPS] does for MPS: symlinks to the
// program's executable in a new temporary directory. It returns the
// daemon's path, for ComputeDomainOptions.IMEXBinary, and a function that
// kills every fake daemon still running from the directory and removes
// it. The program must call imexfake.Main first thing in main (or
// TestMain).
func FakeIMEX() (binary string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "gpudra-imexbin-")
	if err != nil {
		return "", nil, err
	}
	if err := imexfake.Install(dir); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	return filepath.Join(dir, imex.DaemonName), func() {
		_ = fakeprog.Kill(fakeprog.Procs(dir))
		_ = os.RemoveAll(dir)
	}, nil
}
