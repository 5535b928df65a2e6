package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/pkg/computedomain"
	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/imex"
	"github.com/gpudra/gpudra/pkg/simfleet"

	"github.com/gpudra/gpudra/localcluster/install"
	"github.com/gpudra/gpudra/localcluster/simnode"
	cdcontroller "github.com/gpudra/gpudra/pkg/computedomain/controller"
)

// computeDomains is the ComputeDomain driver as the chart installed it:
// the controller Deployment's pod and every node's compute-domains
// container, running in this process.
type computeDomains struct {
	cancel  context.CancelFunc
	done    chan error
	plugins []*draplugin.Driver
	// nodes are those whose plugin started, whose IMEX side stops with it.
	nodes []*simnode.Node
}

// fleetHasClique reports whether a node of the fleet is in a multi-node
// NVLink clique: the fleet the ComputeDomain driver is for.
func fleetHasClique(f *simfleet.Fleet) bool {
	for _, n := range f.Nodes {
		if n.Fabric != nil {
			return true
		}
	}
	return false
}

// startComputeDomains runs the chart's ComputeDomain driver: it waits for
// the chart's CRDs to be served, starts the controller's pod and waits
// until it holds its Lease, then starts the channel plugin on every node,
// each under the chart's ServiceAccount with its node-bound token.
func (c *Cluster) startComputeDomains(ctx context.Context, progress func(string)) error {
	r := c.release
	start := time.Now()
	// Served once a List works; then the mapper must learn the new kinds.
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.dyn.Resource(computedomain.GVR).List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	})
	if err != nil {
		return fmt.Errorf("the chart's ComputeDomain CRD is not served: %w", err)
	}
	c.mapper.Reset()

	runCtx, cancel := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), klog.FromContext(ctx).WithName("compute-domain-controller")))
	cds := &computeDomains{cancel: cancel, done: make(chan error, 1)}
	if err := c.startComputeDomainController(ctx, runCtx, r.ComputeDomainController, cds); err != nil {
		cancel()
		return err
	}
	progress(fmt.Sprintf("%-24s ready in %v", "compute-domain controller", time.Since(start).Round(time.Millisecond)))

	start = time.Now()
	pod := r.ComputeDomainPlugin
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for i, fn := range c.opts.Fleet.Nodes {
		n := c.SimNode(fn.Name)
		if n == nil {
			continue
		}
		wg.Go(func() {
			d, err := c.startComputeDomainPlugin(ctx, n, i, pod)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			cds.plugins = append(cds.plugins, d)
			cds.nodes = append(cds.nodes, n)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	progress(fmt.Sprintf("%-24s ready in %v", fmt.Sprintf("%d channel plugins", len(cds.plugins)), time.Since(start).Round(time.Millisecond)))
	return nil
}

// startComputeDomainController runs `gpudra compute-domain-controller`
// with the arguments of the chart's Deployment, as its ServiceAccount,
// until runCtx ends (its result goes to cds.done; once it runs, cds is the
// cluster's), and waits until it leads: its Lease names it, or, without
// leader election, until it runs.
func (c *Cluster) startComputeDomainController(ctx, runCtx context.Context, pod *install.Pod, cds *computeDomains) error {
	identity := "gpudra-compute-domain-controller-" + string(uuid.NewUUID())[:8]
	args, err := pod.Args(install.Instance{UID: identity, Volume: func(corev1.Volume) (string, error) {
		return "", errors.New("the local cluster runs the compute-domain controller without volumes")
	}})
	if err != nil {
		return err
	}
	if len(args) == 0 || args[0] != "compute-domain-controller" {
		return fmt.Errorf("%s: command line %q: want gpudra compute-domain-controller", pod.Owner, args)
	}
	flags, err := cdcontroller.ParseFlags(args[1:])
	if err != nil {
		return fmt.Errorf("%s: %w", pod.Owner, err)
	}
	if err := flags.Validate(); err != nil {
		return fmt.Errorf("%s: %w", pod.Owner, err)
	}
	rc := c.cp.RESTConfig("gpudra-compute-domain-controller", flags.KubeAPIQPS, flags.KubeAPIBurst)
	rc.Impersonate = serviceAccountIdentity(pod.Namespace, pod.ServiceAccount(), "")
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	stopped := make(chan error, 1)
	go func() {
		err := flags.Run(runCtx, kube, dyn, identity)
		stopped <- err
		cds.done <- err
	}()
	c.computeDomains = cds
	if !flags.LeaderElect {
		return nil
	}
	var holder string
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case err := <-stopped:
			return false, fmt.Errorf("the controller stopped: %w", err)
		default:
		}
		lease, err := c.client.CoordinationV1().Leases(flags.LeaseNamespace).Get(ctx, flags.LeaseName, metav1.GetOptions{})
		if err != nil || lease.Spec.HolderIdentity == nil {
			return false, nil
		}
		holder = *lease.Spec.HolderIdentity
		return holder == identity, nil
	})
	if err != nil {
		return fmt.Errorf("%s: never held its Lease %s/%s (holder %q): %w", pod.Owner, flags.LeaseNamespace, flags.LeaseName, holder, err)
	}
	return nil
}

// startComputeDomainPlugin runs the DaemonSet's compute-domains container
// on node n (the fleet's index-th), in a pod of its own UID, under the
// DaemonSet's ServiceAccount with n's name in its token. The node's IP
// (status.hostIP, the IMEX daemon's address) is 127.0.1.<index+1>. Every
// node's daemon runs on this one machine, where the query port listens on
// loopback: with the IMEX side on, the local cluster gives each node free
// ports of its own in place of the chart's one pair (later flags win).
func (c *Cluster) startComputeDomainPlugin(ctx context.Context, n *simnode.Node, index int, pod *install.Pod) (*draplugin.Driver, error) {
	if index >= 254 {
		return nil, fmt.Errorf("node %s: the local cluster's node IPs 127.0.1.1-254 fit 254 nodes", n.Name())
	}
	ip := fmt.Sprintf("127.0.1.%d", index+1)
	args, err := pod.Args(install.Instance{NodeName: n.Name(), HostIP: ip, UID: simnode.NewPodUID(), Volume: nodeVolumes(c.nodeDir(index), c.opts.DriverName)})
	if err != nil {
		return nil, err
	}
	if c.opts.IMEXBinary != "" {
		ports, err := freePorts(ip, 2)
		if err != nil {
			return nil, fmt.Errorf("node %s: IMEX ports: %w", n.Name(), err)
		}
		args = append(args, "--imex-port="+strconv.Itoa(ports[0]), "--imex-cmd-port="+strconv.Itoa(ports[1]))
	}
	rc := c.cp.RESTConfig("gpudra-compute-domain-kubelet-plugin/"+n.Name(), c.opts.NodeQPS, c.opts.NodeBurst)
	rc.Impersonate = serviceAccountIdentity(pod.Namespace, pod.ServiceAccount(), n.Name())
	return n.StartComputeDomainPlugin(ctx, args, rc)
}

// imexHostsVolume is the chart's volume of the node's hosts file, which
// the IMEX side writes its peers' names into.
const imexHostsVolume = "imex-hosts"

// imexChartValues sets the chart's IMEX values the cluster's options
// imply, where values do not set them: with Options.IMEXBinary, every
// node's channel plugin must supervise that (fake) daemon.
func (c *Cluster) imexChartValues(values map[string]any) map[string]any {
	if c.opts.IMEXBinary == "" {
		return values
	}
	for key, v := range map[string]string{
		"daemon": "required",
		"binary": c.opts.IMEXBinary,
		"ctl":    filepath.Join(filepath.Dir(c.opts.IMEXBinary), imex.CtlName),
	} {
		values = setDefault(values, []string{"computeDomains", "kubeletPlugin", "imex", key}, v)
	}
	return values
}

// setDefault returns values with v at path unless a value is there; the
// maps on the path are copied, not changed.
func setDefault(values map[string]any, path []string, v any) map[string]any {
	out := maps.Clone(values)
	if out == nil {
		out = map[string]any{}
	}
	if len(path) == 1 {
		if _, ok := out[path[0]]; !ok {
			out[path[0]] = v
		}
		return out
	}
	sub, _ := out[path[0]].(map[string]any)
	out[path[0]] = setDefault(sub, path[1:], v)
	return out
}

// stop stops the channel plugins, then the controller.
func (s *computeDomains) stop() error {
	for _, d := range s.plugins {
		d.Stop()
	}
	s.plugins = nil
	for _, n := range s.nodes {
		n.StopIMEX()
	}
	s.nodes = nil
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	s.cancel = nil
	if err := <-s.done; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("compute-domain controller: %w", err)
	}
	return nil
}

// RestartComputeDomainController stops the compute-domain controller's
// pod, as when the Deployment replaces it, and starts a new one (a new
// identity, with the chart's arguments) that must take over the Lease
// the old one released; it returns once the new one leads.
func (c *Cluster) RestartComputeDomainController(ctx context.Context) error {
	s := c.computeDomains
	if s == nil || s.cancel == nil {
		return errors.New("the local cluster runs no compute-domain controller")
	}
	s.cancel()
	if err := <-s.done; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("compute-domain controller: %w", err)
	}
	runCtx, cancel := context.WithCancel(klog.NewContext(context.WithoutCancel(ctx), klog.FromContext(ctx).WithName("compute-domain-controller")))
	s.cancel = cancel
	if err := c.startComputeDomainController(ctx, runCtx, c.release.ComputeDomainController, s); err != nil {
		cancel()
		s.cancel = nil
		return err
	}
	return nil
}

// computeDomainReports lists the ComputeDomains by namespace and name,
// none where the ComputeDomain driver does not run.
func (c *Cluster) computeDomainReports(ctx context.Context) ([]ComputeDomainReport, error) {
	if c.computeDomains == nil {
		return nil, nil
	}
	list, err := c.dyn.Resource(computedomain.GVR).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ComputeDomains: %w", err)
	}
	var out []ComputeDomainReport
	for i := range list.Items {
		cd, err := computedomain.FromUnstructured(&list.Items[i])
		if err != nil {
			return nil, err
		}
		r := ComputeDomainReport{Namespace: cd.Namespace, Name: cd.Name, Status: string(cd.Status.Status), Channel: -1, NumNodes: cd.Spec.NumNodes}
		if cd.Status.Channel != nil {
			r.Channel = int(*cd.Status.Channel)
		}
		nodes := slices.Clone(cd.Status.Nodes)
		slices.SortFunc(nodes, func(a, b *v1beta1.ComputeDomainNode) int { return cmp.Compare(a.Index, b.Index) })
		for _, n := range nodes {
			r.Nodes = append(r.Nodes, n.Name)
		}
		r.Reason = notReadyReason(cd)
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b ComputeDomainReport) int {
		return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
	})
	return out, nil
}

// Dynamic returns the admin's dynamic client, for custom resources such
// as ComputeDomains.
func (c *Cluster) Dynamic() dynamic.Interface { return c.dyn }

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

// notReadyReason says why a domain is NotReady: its false conditions'
// reasons and messages, else how many of its nodes are ready. "" for a
// domain that is not NotReady.
func notReadyReason(cd *v1beta1.ComputeDomain) string {
	if cd.Status.Status != v1beta1.ComputeDomainStatusNotReady {
		return ""
	}
	var parts []string
	for _, cond := range cd.Status.Conditions {
		if cond.Status == metav1.ConditionFalse {
			parts = append(parts, strings.TrimSuffix(cond.Reason+": "+cond.Message, ": "))
		}
	}
	if len(parts) > 0 {
		return strings.Join(parts, "; ")
	}
	ready := 0
	for _, n := range cd.Status.Nodes {
		if n.Status == v1beta1.ComputeDomainStatusReady {
			ready++
		}
	}
	if cd.Spec.NumNodes > 0 {
		return fmt.Sprintf("%d of %d nodes ready", ready, cd.Spec.NumNodes)
	}
	return fmt.Sprintf("%d of %d nodes ready", ready, len(cd.Status.Nodes))
}
