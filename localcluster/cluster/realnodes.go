package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpudra/gpudra/pkg/simfleet"

	"github.com/gpudra/gpudra/localcluster/install"
	"github.com/gpudra/gpudra/localcluster/manifests"
	"github.com/gpudra/gpudra/localcluster/realnode/containerruntime"
	"github.com/gpudra/gpudra/localcluster/realnode/kubelet"
	"github.com/gpudra/gpudra/localcluster/realnode/node"
	"github.com/gpudra/gpudra/localcluster/realnode/probe"
)

// RealNodes make the first Count nodes of the fleet real (package
// realnode/node): the real kubelet, containerd and runc, with gpudra
// installed from the chart's DaemonSet as a container of gpudra's image,
// simulating the fleet's node of the same name (docs/development/real-node.md).
type RealNodes struct {
	// Count is how many. All real nodes share the machine, so each needs
	// host paths of its own: with more than one, each gets its own copy
	// of the chart's DaemonSet (see realNodeDaemonSet).
	Count int
	// FleetName is the fleet Options.Fleet was loaded from: a built-in
	// fleet's name, or a fleet file, which gpudra's container gets a copy
	// of (see [RealNodes.containerFleet]).
	FleetName string
	// Binaries are the real node's programs (node.BuildBinaries). None
	// (the zero value): Start checks that the machine can run a real node
	// and builds them, cached after the first time.
	Binaries node.Binaries
	// KubeletVerbosity is the kubelet's --v.
	KubeletVerbosity int
	// FallBack makes a machine that cannot run the real nodes, or a
	// cluster that does not start with them, no error: Start says why
	// through Options.Progress and starts the fleet's nodes all simulated
	// ([Cluster.RealNodesDropped]). Without it, either fails Start.
	FallBack bool
}

// validate checks the options against the fleet.
func (r *RealNodes) validate(fleet *simfleet.Fleet) error {
	switch {
	case r.Count < 0:
		return fmt.Errorf("real nodes: %d; want 0 or more", r.Count)
	case r.Count > len(fleet.Nodes):
		return fmt.Errorf("real nodes: %d, but the fleet has %d nodes", r.Count, len(fleet.Nodes))
	case r.FleetName == "":
		return errors.New("real nodes: no fleet name: a built-in fleet or the fleet file the cluster's fleet came from")
	}
	for i := range r.Count {
		if fleet.Nodes[i].Mode == simfleet.ModeDevicePlugin {
			return fmt.Errorf("real nodes: fleet node %s runs gpudra's device plugin; a real node runs the DRA plugin from the chart", fleet.Nodes[i].Name)
		}
	}
	return nil
}

// containerFleet returns the --fleet of gpudra's container on the real
// nodes: a built-in fleet by name, or a copy of the fleet file in dir (the
// cluster's directory), by its absolute path. The chart mounts a fleet
// file from the host at the same path (simulation.fleet), and the real
// nodes share this machine's filesystem, so the container simulates the
// very nodes the cluster does; the copy keeps them the same if the user's
// file changes while the cluster runs.
func (r *RealNodes) containerFleet(dir string) (string, error) {
	if slices.Contains(simfleet.BuiltinNames(), r.FleetName) {
		return r.FleetName, nil
	}
	data, err := os.ReadFile(r.FleetName)
	if err != nil {
		return "", fmt.Errorf("real nodes: fleet file: %w", err)
	}
	path, err := filepath.Abs(filepath.Join(dir, "fleet.yaml"))
	if err != nil {
		return "", err
	}
	// Readable by gpudra's container, which runs as root anyway.
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return "", fmt.Errorf("real nodes: copy the fleet file: %w", err)
	}
	return path, nil
}

// realNodeCount is how many of the fleet's first nodes are real.
func (c *Cluster) realNodeCount() int {
	if c.opts.RealNodes == nil {
		return 0
	}
	return c.opts.RealNodes.Count
}

// startRealNodes starts the real nodes, waits until they are Ready, then
// applies the chart's DaemonSet with the values of node.ChartValues and
// waits until gpudra's container on each has published its ResourceSlices.
func (c *Cluster) startRealNodes(ctx context.Context, progress func(string)) error {
	n := c.realNodeCount()
	if n == 0 {
		return nil
	}
	start := time.Now()
	imagesDir := filepath.Join(c.dir, "images")
	if err := os.MkdirAll(imagesDir, 0o755); err != nil {
		return err
	}
	// The go build of gpudra is seconds when cached, minutes when not.
	progress("real nodes: building gpudra and its image from this checkout (minutes when Go's build cache is cold)")
	testImage, err := containerruntime.WriteTestImage(imagesDir)
	if err != nil {
		return fmt.Errorf("real nodes: %w", err)
	}
	gpudraImage, err := node.WriteGPUDRAImage(ctx, imagesDir)
	if err != nil {
		return fmt.Errorf("real nodes: %w", err)
	}
	progress(fmt.Sprintf("%-24s ready in %v", "images for real nodes", time.Since(start).Round(time.Millisecond)))
	fleet, err := c.opts.RealNodes.containerFleet(c.dir)
	if err != nil {
		return err
	}

	var daemonSets []*appsv1.DaemonSet
	for i := range n {
		fn := c.opts.Fleet.Nodes[i]
		dir := filepath.Join(c.dir, "r", fmt.Sprint(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		cert, key := filepath.Join(dir, "kubelet.crt"), filepath.Join(dir, "kubelet.key")
		if err := c.cp.WriteKubeletServingCert(fn.Name, cert, key); err != nil {
			return err
		}
		rn, err := node.Start(ctx, node.Config{
			Name:       fn.Name,
			Dir:        dir,
			Binaries:   c.opts.RealNodes.Binaries,
			Images:     []string{testImage, gpudraImage},
			Kubeconfig: c.cp.KubeconfigPath(),
			CertFile:   cert,
			KeyFile:    key,
			Labels:     cliqueLabel(&fn),
			// Distinct per process and node: two local clusters on one
			// machine must not share a bridge or addresses (and not
			// containerruntime's tests', which take 10.100-199.x.0/24).
			PodCIDR:   fmt.Sprintf("10.%d.%d.0/24", 200+(os.Getpid()+i)/256%50, (os.Getpid()+i)%256),
			Bridge:    fmt.Sprintf("gsim%d-%d", os.Getpid()%100000, i),
			Verbosity: c.opts.RealNodes.KubeletVerbosity,
		})
		if err != nil {
			return err
		}
		c.real = append(c.real, rn)
		// Seconds on the machines seen; a kubelet that never gets
		// there says why in its error (the Node's Ready condition).
		readyCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err = rn.WaitReady(readyCtx, c.client)
		cancel()
		if err != nil {
			return err
		}
		ds, err := c.realNodeDaemonSet(rn, fn, fleet, n > 1)
		if err != nil {
			return err
		}
		daemonSets = append(daemonSets, ds)
	}
	progress(fmt.Sprintf("%-24s ready in %v", fmt.Sprintf("%d real node(s) (kubelet)", n), time.Since(start).Round(time.Millisecond)))
	if changed := kubelet.ChangedSysctls(); len(changed) > 0 {
		// The machine is a developer's: say so, as the kubelet does not.
		progress(fmt.Sprintf("real nodes: the kubelet changed this machine's sysctls %s; they are written back when the cluster stops (not if the process is killed)", strings.Join(changed, ", ")))
	}
	// The DaemonSets as the chart rendered them, with the real nodes'
	// values; the DaemonSet controller makes their pods.
	for _, ds := range daemonSets {
		if _, err := c.client.AppsV1().DaemonSets(ds.Namespace).Create(ctx, ds, metav1.CreateOptions{FieldManager: "gpudra-sim"}); err != nil {
			return fmt.Errorf("real nodes: create %s/%s: %w", ds.Namespace, ds.Name, err)
		}
	}
	for _, rn := range c.real {
		if err := c.waitForSlices(ctx, rn); err != nil {
			return err
		}
	}
	progress(fmt.Sprintf("%-24s ready in %v", fmt.Sprintf("%d real node(s) (gpudra)", n), time.Since(start).Round(time.Millisecond)))
	return nil
}

// realNodeDaemonSet renders the chart with the cluster's values and the
// real node's over them, and returns its DaemonSet. The fleet node's own
// MIG mode and sharing, where it sets them, are the node's chart values
// (on a cluster: a values file per node pool), as the in-process plugins
// take them. The plugin's HTTP port (probes, metrics) is a free one: the
// pod runs in the machine's network.
//
// With own set (more than one real node), the DaemonSet is this node's
// alone: its host paths are the node's, so it selects the node by name,
// and its name and selector gain the node's name (label NodeNameLabel),
// so that the DaemonSets of several real nodes neither share a name nor
// select each other's pods.
func (c *Cluster) realNodeDaemonSet(rn *node.Node, fn simfleet.Node, fleet string, own bool) (*appsv1.DaemonSet, error) {
	ds, port, err := realNodeDaemonSet(c.chartValues, c.opts.ChartNamespace, rn.Name(), rn.Layout(), fn, fleet, c.cp.RESTConfig("real-node", 1, 1).Host, own)
	if err != nil {
		return nil, err
	}
	if c.realEndpoints == nil {
		c.realEndpoints = map[string]string{}
	}
	// The pod runs in the machine's network, listening on every address.
	c.realEndpoints[rn.Name()] = fmt.Sprintf("http://127.0.0.1:%d", port)
	return ds, nil
}

// realNodeDaemonSet is [Cluster.realNodeDaemonSet] on its inputs: the
// cluster's chart values and namespace, the node's name and layout, its
// fleet node, the container's --fleet and the API server's URL. It also
// returns the plugin's HTTP port.
func realNodeDaemonSet(chartValues map[string]any, namespace, name string, layout node.Layout, fn simfleet.Node, fleet, apiServer string, own bool) (*appsv1.DaemonSet, int, error) {
	over, err := node.ChartValues(layout, fleet, apiServer)
	if err != nil {
		return nil, 0, err
	}
	plugin := over["kubeletPlugin"].(map[string]any)
	for value, set := range map[string]string{"migMode": fn.MIGMode, "sharing": fn.Sharing, "sharingDefault": fn.SharingDefault} {
		if set != "" {
			plugin[value] = set
		}
	}
	if fn.MIGModeSwitching {
		plugin["migModeSwitching"] = true
	}
	port, err := freePort()
	if err != nil {
		return nil, 0, fmt.Errorf("real node %s: %w", name, err)
	}
	plugin["httpPort"] = port
	if own {
		plugin["nodeSelector"] = map[string]any{node.Label: "true", corev1.LabelHostname: name}
	}
	r, err := install.Render(install.Options{Values: node.MergeValues(chartValues, over), Namespace: namespace})
	if err != nil {
		return nil, 0, fmt.Errorf("real node %s: %w", name, err)
	}
	for _, o := range r.Objects {
		// The kubelet plugin's; the chart's device-plugin DaemonSet
		// (devicePlugin.enabled) is not for a real node.
		ds, ok := o.Object.(*appsv1.DaemonSet)
		if !ok || ds.Name != kubeletPluginDaemonSet {
			continue
		}
		if own {
			ds.Name += "-" + name
			ds.Spec.Selector.MatchLabels[NodeNameLabel] = name
			ds.Spec.Template.Labels[NodeNameLabel] = name
		}
		return ds, port, nil
	}
	return nil, 0, fmt.Errorf("real node %s: %s renders no DaemonSet %s", name, install.ChartPath, kubeletPluginDaemonSet)
}

// kubeletPluginDaemonSet is the name of the chart's kubelet plugin
// DaemonSet.
const kubeletPluginDaemonSet = "gpudra-kubelet-plugin"

// NodeNameLabel tells apart the DaemonSets (and their pods) of several
// real nodes: the node's name.
const NodeNameLabel = "sim.gpudra.io/real-node-name"

// freePort returns a TCP port that nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", ":0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitForSlices waits until the real node's ResourceSlices of the
// cluster's driver are published: gpudra's container runs and the kubelet
// registered it.
func (c *Cluster) waitForSlices(ctx context.Context, rn *node.Node) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		slices, err := c.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + rn.Name() + ",spec.driver=" + c.opts.DriverName})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		if len(slices.Items) > 0 {
			return true, nil
		}
		pods, err := c.client.CoreV1().Pods(c.release.Namespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + rn.Name()})
		if err == nil {
			last = "no gpudra pod yet"
			for _, p := range pods.Items {
				last = fmt.Sprintf("pod %s %s %s", p.Name, p.Status.Phase, PodReason(&p))
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("real node %s: gpudra published no ResourceSlices (%s; kubelet log %s, containerd log %s): %w", rn.Name(), last, rn.KubeletLog(), rn.RuntimeLog(), err)
	}
	return nil
}

// RealNodes returns the real nodes in fleet order.
func (c *Cluster) RealNodes() []*node.Node { return c.real }

// RealNode returns the real node called name, or nil.
func (c *Cluster) RealNode(name string) *node.Node {
	for _, n := range c.real {
		if n.Name() == name {
			return n
		}
	}
	return nil
}

// stopRealNodes stops the real nodes (kubelet, then runtime, which
// removes their containers).
func (c *Cluster) stopRealNodes(ctx context.Context) error {
	errs := make([]error, len(c.real))
	var wg sync.WaitGroup
	for i, n := range c.real {
		wg.Go(func() { errs[i] = n.Stop() })
	}
	wg.Wait()
	c.real = nil
	err := errors.Join(errs...)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Stopping the real nodes")
	}
	return err
}

// RealNodeProbeNamespace holds the probe pods of [Cluster.RealNodeProbes].
const RealNodeProbeNamespace = "real-node"

// probeSleep is how long a probe pod's container sleeps after printing:
// longer than a local cluster runs; the cluster's stop removes it.
const probeSleep = 24 * 3600

// RealNodeProbes returns, for each real node, a pod with a one-GPU claim
// (DeviceClass gpu.nvidia.com) whose busybox container prints what it
// sees (package probe) and then sleeps, keeping its claim, in namespace
// RealNodeProbeNamespace, to apply with the other manifests: the report
// then shows, per real node, what a container of it saw.
func (c *Cluster) RealNodeProbes() ([]manifests.Object, error) {
	if len(c.real) == 0 {
		return nil, nil
	}
	ns := &corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}, ObjectMeta: metav1.ObjectMeta{Name: RealNodeProbeNamespace}}
	tmpl := &resourceapi.ResourceClaimTemplate{
		TypeMeta:   metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "ResourceClaimTemplate"},
		ObjectMeta: metav1.ObjectMeta{Namespace: RealNodeProbeNamespace, Name: "one-gpu"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.nvidia.com"}}},
		}}},
	}
	objs := []kruntime.Object{ns, tmpl}
	for _, rn := range c.real {
		objs = append(objs, &corev1.Pod{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Namespace: RealNodeProbeNamespace, Name: "probe-" + rn.Name()},
			Spec: corev1.PodSpec{
				NodeSelector:                  map[string]string{corev1.LabelHostname: rn.Name()},
				Tolerations:                   []corev1.Toleration{node.Toleration},
				TerminationGracePeriodSeconds: ptr.To(int64(1)),
				Containers: []corev1.Container{{
					Name:            "probe",
					Image:           containerruntime.TestImage,
					ImagePullPolicy: corev1.PullNever,
					Command:         probe.Command(probeSleep),
					Resources:       corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
				}},
				ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("one-gpu")}},
			},
		})
	}
	var out []manifests.Object
	for _, o := range objs {
		u, err := kruntime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			return nil, err
		}
		out = append(out, manifests.Object{Unstructured: &unstructured.Unstructured{Object: u}, Source: "gpudra-sim --real-nodes"})
	}
	return out, nil
}

// seenInContainer returns what the container of a pod on a real node
// printed with package probe's command, nil for a pod elsewhere or a
// container that printed something else.
func (c *Cluster) seenInContainer(pod *corev1.Pod, container string) *probe.Seen {
	rn := c.RealNode(pod.Spec.NodeName)
	if rn == nil {
		return nil
	}
	out, err := rn.ContainerLog(pod, container)
	if err != nil {
		return nil
	}
	seen, complete := probe.Parse(out)
	if !complete {
		return nil
	}
	return seen
}
