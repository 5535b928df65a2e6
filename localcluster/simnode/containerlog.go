package simnode

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpudra/gpudra/pkg/mps"
)

// containerLog is what `kubectl logs` shows for a container on a
// simulated node. Nothing runs there, so instead of output the log says
// what the container runtime would have given the container: its claims'
// devices, the CDI devices and what the CDI library resolved them into
// (device nodes, environment, mounts), and how its GPUs are shared (MPS
// daemons with their caps, time slices). One item per line, each starting
// with what it is, so that grep and --tail work on it.
func containerLog(node string, pod *corev1.Pod, container string, d ContainerDevices) string {
	var b strings.Builder
	fmt.Fprintf(&b, "gpudra-sim: node %s runs no containers; container %s of pod %s/%s would have been given:\n", node, container, pod.Namespace, pod.Name)
	if len(d.CDIDevices) == 0 && len(d.Claims) == 0 {
		b.WriteString("no devices: the container uses no claim\n")
	}
	for _, c := range d.Claims {
		for _, dev := range c.Devices {
			fmt.Fprintf(&b, "claim %s: request %s: device %s/%s/%s\n", c.Name, strings.Join(dev.Requests, ","), dev.Driver, dev.Pool, dev.Device)
		}
	}
	for _, id := range d.CDIDevices {
		fmt.Fprintf(&b, "CDI device: %s\n", id)
	}
	for _, p := range d.DeviceNodes {
		fmt.Fprintf(&b, "device node: %s\n", p)
	}
	for _, k := range slices.Sorted(maps.Keys(d.Env)) {
		fmt.Fprintf(&b, "env: %s=%s\n", k, d.Env[k])
	}
	for _, m := range d.Mounts {
		fmt.Fprintf(&b, "mount: %s\n", m)
	}
	for _, m := range d.MPS {
		fmt.Fprintf(&b, "MPS daemon %s: %s\n", m.ID, MPSCaps(m))
	}
	for _, t := range d.TimeSlices {
		fmt.Fprintf(&b, "time slice: %s (%s): %s\n", t.Device, t.GPU, t.Interval)
	}
	return b.String()
}

// MPSCaps describes what an MPS daemon serves and the caps it enforces,
// e.g. "GPU-1234: active threads 25%, pinned memory 20480 MiB".
func MPSCaps(m MPSDaemon) string {
	var parts []string
	for _, dev := range m.Devices {
		var caps []string
		if m.ActiveThreadPercentage != nil {
			caps = append(caps, fmt.Sprintf("active threads %d%%", *m.ActiveThreadPercentage))
		}
		if b, ok := m.PinnedMemoryLimits[dev]; ok {
			// The daemon takes whole MiB, rounded down.
			caps = append(caps, fmt.Sprintf("pinned memory %d MiB", b/mps.MiB))
		}
		if len(caps) == 0 {
			caps = append(caps, "no caps")
		}
		parts = append(parts, dev+": "+strings.Join(caps, ", "))
	}
	return strings.Join(parts, "; ")
}

// ContainerLog is what `kubectl logs` shows for a container of pod on this
// node (see containerLog), or an error naming why there is none: the pod
// is not on the node, has no such container, or has not started.
func (n *Node) ContainerLog(pod *corev1.Pod, container string) (string, error) {
	st, ok := n.loop.podByName(pod.Namespace, pod.Name)
	if !ok {
		return "", fmt.Errorf("pod %s/%s is not on node %s", pod.Namespace, pod.Name, n.cfg.Name)
	}
	if !slices.ContainsFunc(st.pod.Spec.Containers, func(c corev1.Container) bool { return c.Name == container }) {
		return "", fmt.Errorf("pod %s/%s has no container %q", pod.Namespace, pod.Name, container)
	}
	devs, started := st.containers[container]
	if !started {
		return "", fmt.Errorf("container %q of pod %s/%s has not started", container, pod.Namespace, pod.Name)
	}
	return containerLog(n.cfg.Name, st.pod, container, devs), nil
}
