package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// PluginContainer is the name of gpudra's kubelet-plugin container in the
// chart's DaemonSet.
const PluginContainer = "plugin"

// PluginPID returns the process ID of gpudra's kubelet plugin on this node:
// the one `gpudra-node kubelet-plugin` process whose arguments name the node's
// plugin registration directory.
func (n *Node) PluginPID() (int, error) {
	want := "--registrar-dir=" + n.layout.RegistryDir()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var found []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 1 && args[1] == "kubelet-plugin" && slices.Contains(args, want) {
			found = append(found, pid)
		}
	}
	if len(found) != 1 {
		return 0, fmt.Errorf("real node %s: gpudra kubelet-plugin processes with %s: %v, want one", n.cfg.Name, want, found)
	}
	return found[0], nil
}

// RestartPlugin kills gpudra's plugin process in its container of the pod
// of the chart's DaemonSet in namespace on this node, as a crash would,
// and returns once the kubelet has restarted the container and it is
// ready again (registered and publishing).
func (n *Node) RestartPlugin(ctx context.Context, client kubernetes.Interface, namespace string) error {
	pods, err := client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.cfg.Name})
	if err != nil {
		return fmt.Errorf("real node %s: restart gpudra's plugin: %w", n.cfg.Name, err)
	}
	var pod *corev1.Pod
	for i := range pods.Items {
		if restartCount(&pods.Items[i]) >= 0 {
			pod = &pods.Items[i]
		}
	}
	if pod == nil {
		return fmt.Errorf("real node %s: restart gpudra's plugin: no pod in %s with a %q container", n.cfg.Name, namespace, PluginContainer)
	}
	before := restartCount(pod)
	pid, err := n.PluginPID()
	if err != nil {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("real node %s: kill gpudra's plugin (pid %d): %w", n.cfg.Name, pid, err)
	}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || restartCount(p) <= before {
			return false, nil
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name == PluginContainer {
				return cs.Ready, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("real node %s: gpudra's container was not restarted and ready: %w", n.cfg.Name, err)
	}
	return nil
}

// restartCount is the restart count of the pod's plugin container, -1
// for a pod without one.
func restartCount(p *corev1.Pod) int32 {
	if !slices.ContainsFunc(p.Spec.Containers, func(c corev1.Container) bool { return c.Name == PluginContainer }) {
		return -1
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == PluginContainer {
			return cs.RestartCount
		}
	}
	return 0
}
