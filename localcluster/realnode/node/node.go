// Package node runs one real node of the local cluster: the container
// runtime of package containerruntime (containerd, runc, a bridge pod
// network) and the real kubelet of package kubelet, under one node
// directory, with the images the node's pods need imported (the test
// image, gpudra's own). gpudra reaches it the way it reaches any node: the
// chart's DaemonSet, through the DaemonSet controller, with the values of
// [ChartValues].
package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/internal/mpsfake"

	"github.com/gpudra/gpudra/localcluster/realnode/containerruntime"
	"github.com/gpudra/gpudra/localcluster/realnode/kubelet"
)

// Label is the label of every real node (value "true"): the chart's
// DaemonSet selects real nodes by it, and the local cluster's in-process
// plugin pods serve the simulated ones.
const Label = "sim.gpudra.io/real-node"

// Taint keeps pods that do not tolerate it off real nodes (key Label,
// effect NoSchedule): the examples name images no real node has. The
// probe pods and the DaemonSet tolerate it.
var Taint = corev1.Taint{Key: Label, Value: "true", Effect: corev1.TaintEffectNoSchedule}

// Toleration tolerates Taint.
var Toleration = corev1.Toleration{Key: Label, Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectNoSchedule}

// Config describes one real node.
type Config struct {
	// Name is the Node's name: a node of the simulated fleet.
	Name string
	// Dir is the node directory (short: unix sockets lie below it): the
	// runtime's, bind-mounted onto itself with shared propagation; the
	// kubelet's root directory and every host path gpudra's pod mounts
	// lie below it too (see [Layout]).
	Dir string
	// Binaries are the programs (see [BuildBinaries]).
	Binaries Binaries
	// Images are image archives imported into the runtime before the
	// kubelet starts.
	Images []string
	// Kubeconfig is the API server's client configuration for the
	// kubelet; CertFile and KeyFile its serving certificate.
	Kubeconfig        string
	CertFile, KeyFile string
	// Labels are the Node's labels besides Label.
	Labels map[string]string
	// PodCIDR and Bridge are the node's pod network (see
	// containerruntime.Config); nodes of one machine need distinct ones.
	PodCIDR, Bridge string
	// Verbosity is the kubelet's --v.
	Verbosity int
}

// Node is a running real node.
type Node struct {
	cfg     Config
	layout  Layout
	runtime *containerruntime.Runtime
	kubelet *kubelet.Kubelet
}

// Start starts the runtime, imports the images and starts the kubelet;
// WaitReady waits for the Node. Everything runs until Stop.
func Start(ctx context.Context, cfg Config) (_ *Node, finalErr error) {
	if cfg.Name == "" || cfg.Dir == "" {
		return nil, errors.New("real node: Config.Name and Config.Dir are required")
	}
	l, err := NewLayout(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("real node %s: %w", cfg.Name, err)
	}
	for _, dir := range []string{l.CDIDir(), l.DriverRoot(), l.MPSRoot(), l.SimStateDir()} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("real node %s: %w", cfg.Name, err)
		}
	}
	if err := installFakeMPS(cfg.Binaries.FakeMPS, l.DriverRoot()); err != nil {
		return nil, fmt.Errorf("real node %s: %w", cfg.Name, err)
	}
	n := &Node{cfg: cfg, layout: l}
	defer func() {
		if finalErr != nil {
			finalErr = errors.Join(finalErr, n.Stop())
		}
	}()
	n.runtime, err = containerruntime.Start(ctx, containerruntime.Config{
		Dir:      cfg.Dir,
		CDIDirs:  []string{l.CDIDir()},
		Binaries: cfg.Binaries.Runtime,
		PodCIDR:  cfg.PodCIDR,
		Bridge:   cfg.Bridge,
	})
	if err != nil {
		return nil, fmt.Errorf("real node %s: %w", cfg.Name, err)
	}
	for _, archive := range cfg.Images {
		if err := n.runtime.Import(ctx, archive); err != nil {
			return nil, fmt.Errorf("real node %s: %w", cfg.Name, err)
		}
	}
	labels := map[string]string{Label: "true"}
	for k, v := range cfg.Labels {
		labels[k] = v
	}
	n.kubelet, err = kubelet.Start(ctx, kubelet.Config{
		Binary:          cfg.Binaries.Kubelet,
		NodeName:        cfg.Name,
		RootDir:         l.KubeletRoot(),
		PodLogsDir:      l.PodLogsDir(),
		Kubeconfig:      cfg.Kubeconfig,
		RuntimeEndpoint: n.runtime.Endpoint(),
		Labels:          labels,
		Taints:          []corev1.Taint{Taint},
		CertFile:        cfg.CertFile,
		KeyFile:         cfg.KeyFile,
		Verbosity:       cfg.Verbosity,
		LogFile:         filepath.Join(cfg.Dir, "kubelet.log"),
	})
	if err != nil {
		return nil, fmt.Errorf("real node %s: %w", cfg.Name, err)
	}
	klog.FromContext(ctx).V(1).Info("Real node started", "node", cfg.Name, "dir", cfg.Dir, "cri", n.runtime.Endpoint())
	return n, nil
}

// installFakeMPS copies the fake MPS program into the driver root's
// usr/bin under the names of nvidia-cuda-mps-control and -server, where
// gpudra's container looks for them: copies, since a link to a path
// outside the driver root would not resolve in the container.
func installFakeMPS(program, driverRoot string) error {
	if program == "" {
		return nil
	}
	data, err := os.ReadFile(program)
	if err != nil {
		return fmt.Errorf("fake MPS control: %w", err)
	}
	bin := filepath.Join(driverRoot, "usr", "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	for _, name := range []string{mpsfake.ControlName, mpsfake.ServerName} {
		if err := os.WriteFile(filepath.Join(bin, name), data, 0o755); err != nil {
			return fmt.Errorf("fake MPS control: %w", err)
		}
	}
	return nil
}

// Name returns the Node's name.
func (n *Node) Name() string { return n.cfg.Name }

// Layout returns where the node's directories are.
func (n *Node) Layout() Layout { return n.layout }

// KubeletLog returns the kubelet's log file; RuntimeLog containerd's.
func (n *Node) KubeletLog() string { return n.kubelet.Config().LogFile }

// RuntimeLog returns containerd's log file.
func (n *Node) RuntimeLog() string { return n.runtime.LogFile() }

// WaitReady waits until the Node is Ready.
func (n *Node) WaitReady(ctx context.Context, client kubernetes.Interface) error {
	return n.kubelet.WaitReady(ctx, client)
}

// RestartKubelet stops the kubelet and starts it again with the same
// configuration (ports, directories); containers keep running meanwhile,
// as on any node. It returns once the Node is Ready again.
func (n *Node) RestartKubelet(ctx context.Context, client kubernetes.Interface) error {
	cfg := n.kubelet.Config()
	if err := n.kubelet.Stop(); err != nil {
		return fmt.Errorf("real node %s: restart the kubelet: %w", n.cfg.Name, err)
	}
	k, err := kubelet.Start(ctx, cfg)
	if err != nil {
		return fmt.Errorf("real node %s: restart the kubelet: %w", n.cfg.Name, err)
	}
	n.kubelet = k
	return k.WaitReady(ctx, client)
}

// ContainerLog returns what a container of a pod on this node wrote.
func (n *Node) ContainerLog(pod *corev1.Pod, container string) (string, error) {
	return n.kubelet.ContainerLog(pod, container)
}

// Stop stops the kubelet, then the runtime (which removes the node's
// pods and unmounts the node directory). The Node object stays.
func (n *Node) Stop() error {
	var errs []error
	if n.kubelet != nil {
		errs = append(errs, n.kubelet.Stop())
		n.kubelet = nil
	}
	if n.runtime != nil {
		errs = append(errs, n.runtime.Stop())
		n.runtime = nil
	}
	return errors.Join(errs...)
}
