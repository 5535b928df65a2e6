package simnode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
	_ "unsafe" // go:linkname, below

	cadvisorapi "github.com/google/cadvisor/lib/model"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"

	"github.com/gpudra/gpudra/pkg/deviceplugin"
	"github.com/gpudra/gpudra/pkg/mps"
)

// newDeviceManager is the kubelet's device manager with its registration
// socket at socketPath. The exported constructor puts the socket at the
// fixed /var/lib/kubelet/device-plugins/kubelet.sock, which several
// simulated nodes in one process cannot share; this is the same
// constructor with the path as a parameter, as the package's own tests
// use it.
//
//go:linkname newDeviceManager k8s.io/kubernetes/pkg/kubelet/cm/devicemanager.newManagerImpl
func newDeviceManager(logger klog.Logger, socketPath string, topology []cadvisorapi.Node, topologyAffinityStore topologymanager.Store) (*devicemanager.ManagerImpl, error)

// devicePluginDir is the node's kubelet device-plugin directory.
func (c *Config) devicePluginDir() string { return filepath.Join(c.Dir, "device-plugins") }

// startDeviceManager starts the kubelet's device manager on the node's
// device-plugin directory. A restarted manager reads its checkpoint, as
// the kubelet does, and removes the plugins' sockets, so they register
// again.
func (n *Node) startDeviceManager() error {
	if err := os.MkdirAll(n.cfg.devicePluginDir(), 0o750); err != nil {
		return err
	}
	dm, err := newDeviceManager(n.logger, filepath.Join(n.cfg.devicePluginDir(), "kubelet.sock"), nil, topologymanager.NewFakeManager(n.logger))
	if err != nil {
		return fmt.Errorf("node %s: device manager: %w", n.cfg.Name, err)
	}
	if err := dm.Start(n.logger, n.loop.activePods, n.loop.sourcesReady, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return fmt.Errorf("node %s: start device manager: %w", n.cfg.Name, err)
	}
	n.devMu.Lock()
	n.devices = dm
	n.devMu.Unlock()
	return nil
}

// deviceManager is the running device manager, nil on a DRA node.
func (n *Node) deviceManager() *devicemanager.ManagerImpl {
	n.devMu.Lock()
	defer n.devMu.Unlock()
	return n.devices
}

// RestartKubelet stops the device manager and starts a new one, as a
// kubelet restart does: the new one re-creates kubelet.sock, the plugins
// register again, and the allocations of running pods come back from its
// checkpoint.
func (n *Node) RestartKubelet() error {
	dm := n.deviceManager()
	if dm == nil {
		return errors.New("the node runs no device manager (a DRA node)")
	}
	if err := dm.Stop(n.logger); err != nil {
		return err
	}
	return n.startDeviceManager()
}

// startDevicePlugin starts gpudra's device plugin on the node and waits
// until the device manager has its resources; then the Node's capacity
// follows the manager's, as the kubelet's node status does.
func (n *Node) startDevicePlugin(ctx context.Context) error {
	opts := deviceplugin.Options{
		Hardware:        n.cfg.Hardware,
		DriverName:      n.cfg.DriverName,
		PluginDir:       n.cfg.devicePluginDir(),
		CDIDir:          n.cfg.CDIDir(),
		RegisterTimeout: 5 * time.Second,
	}
	if c := n.cfg.DevicePlugin; c != nil {
		if s := c.Flags.MigStrategy; s != nil {
			opts.Plan.MIGStrategy = *s
		}
		if p := c.Flags.Plugin; p != nil {
			opts.DeviceListStrategies = p.DeviceListStrategy
			if p.DeviceIDStrategy != nil {
				opts.Plan.DeviceIDStrategy = *p.DeviceIDStrategy
			}
		}
		opts.Plan.TimeSlicing = c.Sharing.TimeSlicing
		if c.Sharing.MPS != nil {
			opts.Plan.MPS = *c.Sharing.MPS
			if n.cfg.MPSControlBinary != "" {
				m, err := mps.New(n.mpsRoot, mps.WithControlBinary(n.cfg.MPSControlBinary))
				if err != nil {
					return fmt.Errorf("node %s: MPS: %w", n.cfg.Name, err)
				}
				opts.MPS = m
			}
		}
	}
	p, err := deviceplugin.New(n.ctx, opts)
	if err != nil {
		return fmt.Errorf("node %s: device plugin: %w", n.cfg.Name, err)
	}
	runCtx, cancel := context.WithCancel(n.ctx)
	done := make(chan struct{})
	n.devicePlugin, n.stopDevicePlugin = p, func() { cancel(); <-done }
	go func() {
		defer close(done)
		if err := p.Run(runCtx); err != nil {
			n.logger.Error(err, "Device plugin stopped")
		}
	}()
	want := map[string]int{}
	for _, r := range p.Resources() {
		want[r.Name] = len(r.Devices)
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		capacity, _, _ := n.deviceManager().GetCapacity(n.logger)
		for name, count := range want {
			q, ok := capacity[corev1.ResourceName(name)]
			if !ok || q.Value() != int64(count) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("node %s: the device manager does not have the device plugin's resources %v: %w", n.cfg.Name, want, err)
	}
	if err := n.syncDeviceCapacity(ctx); err != nil {
		return err
	}
	go wait.UntilWithContext(runCtx, func(ctx context.Context) {
		if err := n.syncDeviceCapacity(ctx); err != nil && ctx.Err() == nil {
			n.logger.Error(err, "Node capacity of the device plugin's resources")
		}
	}, 500*time.Millisecond)
	return nil
}

// syncDeviceCapacity writes the device manager's capacity and allocatable
// (healthy devices) into the Node's status when they changed.
func (n *Node) syncDeviceCapacity(ctx context.Context) error {
	dm := n.deviceManager()
	if dm == nil {
		return nil
	}
	capacity, allocatable, removed := dm.GetCapacity(n.logger)
	// The manager's view changes on health and registrations only: no
	// API round trip while it is what was written last.
	synced := fmt.Sprint(capacity, allocatable, removed)
	n.devMu.Lock()
	same := synced == n.syncedCapacity
	n.devMu.Unlock()
	if same {
		return nil
	}
	client := n.cfg.KubeletClient.CoreV1().Nodes()
	node, err := client.Get(ctx, n.cfg.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	updated := node.DeepCopy()
	for name, q := range capacity {
		updated.Status.Capacity[name] = q
	}
	for name, q := range allocatable {
		updated.Status.Allocatable[name] = q
	}
	for _, name := range removed {
		delete(updated.Status.Capacity, corev1.ResourceName(name))
		delete(updated.Status.Allocatable, corev1.ResourceName(name))
	}
	if !apiequality.Semantic.DeepEqual(node.Status, updated.Status) {
		if _, err := client.UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	n.devMu.Lock()
	n.syncedCapacity = synced
	n.devMu.Unlock()
	return nil
}

// admit allocates the pod's containers' device-plugin resources, one pod
// at a time: the kubelet's admission handler calls Allocate serially,
// and the device manager relies on it (it keeps one pod's reusable
// devices at a time).
func (n *Node) admit(ctx context.Context, dm *devicemanager.ManagerImpl, pod *corev1.Pod) error {
	n.admitMu.Lock()
	defer n.admitMu.Unlock()
	for i := range pod.Spec.InitContainers {
		if err := dm.Allocate(ctx, pod, &pod.Spec.InitContainers[i], lifecycle.AddOperation); err != nil {
			return err
		}
	}
	for i := range pod.Spec.Containers {
		if err := dm.Allocate(ctx, pod, &pod.Spec.Containers[i], lifecycle.AddOperation); err != nil {
			return err
		}
	}
	return nil
}

// MigrateToDRA moves a drained device-plugin node to DRA, as
// docs/guides/migration.md tells an operator to: the device plugin stops, the
// kubelet drops its resources from the Node (a real kubelet does so five
// minutes after the plugin's socket went away, or at its next restart),
// and gpudra's DRA plugin starts and publishes the node's GPUs. Pods that
// still hold device-plugin GPUs on the node keep them on record, as a
// real node's would; drain it first.
func (n *Node) MigrateToDRA(ctx context.Context) error {
	dm := n.deviceManager()
	if dm == nil || n.stopDevicePlugin == nil {
		return errors.New("the node runs no device plugin")
	}
	n.stopDevicePlugin()
	resources := n.devicePlugin.Resources()
	n.devMu.Lock()
	n.devices, n.devicePlugin, n.stopDevicePlugin = nil, nil, nil
	n.devMu.Unlock()
	if err := dm.Stop(n.logger); err != nil {
		return err
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := n.cfg.KubeletClient.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, r := range resources {
			delete(node.Status.Capacity, corev1.ResourceName(r.Name))
			delete(node.Status.Allocatable, corev1.ResourceName(r.Name))
		}
		_, err = n.cfg.KubeletClient.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("node %s: drop the device plugin's resources: %w", n.cfg.Name, err)
	}
	return n.StartPlugin(ctx)
}

// DevicePlugin returns the node's device plugin, nil on a DRA node.
func (n *Node) DevicePlugin() *deviceplugin.Plugin { return n.devicePlugin }
