// Package footprint measures what a kubelet plugin process costs its node:
// the time from starting the process to its DRA socket accepting
// connections, and its resident memory (VmRSS, RssAnon, RssFile of
// /proc/<pid>/status) once it has published its devices and again after
// a number of Prepare/Unprepare cycles.
//
// The plugin runs as a DaemonSet runs it: its own process, with simulated
// GPUs (--fleet), against package apiserver's in-repo API server, in
// temporary directories for its data, the kubelet's registration
// directory and CDI specs. The measurement is the kubelet: it creates a
// claim (and its pod) per cycle as the scheduler would, allocated to one
// of the node's GPUs in turn, calls NodePrepareResources and
// NodeUnprepareResources over the DRA socket, and deletes them. The
// figures are reported, never judged: the benchmark in this package
// reports them for benchstat, docs/design/performance.md says what they
// were.
package footprint

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/deployments/deviceclasses"
	"github.com/gpudra/gpudra/internal/chaos/apiserver"
)

// Names of the simulated node.
const (
	driverName = v1beta1.GPUDriverName
	nodeName   = "footprint-0"
	namespace  = "default"
)

// fleetYAML is the simulated node: eight whole H100s, as a DGX H100.
const fleetYAML = `nodes:
- name: footprint-0
  gpus:
  - model: H100-SXM5-80GB
  - model: H100-SXM5-80GB
  - model: H100-SXM5-80GB
  - model: H100-SXM5-80GB
  - model: H100-SXM5-80GB
  - model: H100-SXM5-80GB
  - model: H100-SXM5-80GB
  - model: H100-SXM5-80GB
`

// gpus is the number of GPUs of fleetYAML, named gpu-0 to gpu-7.
const gpus = 8

// Options say which plugin to measure and how.
type Options struct {
	// Binary is the program to run, Command its subcommand before the
	// flags this package passes (e.g. ["kubelet-plugin"]).
	Binary  string
	Command []string
	// Dir holds the plugin's directories and its log (plugin.log); it
	// must be short enough for unix sockets below it (internal/shorttemp).
	Dir string
	// Cycles is the number of Prepare/Unprepare cycles, one claim each.
	Cycles int
}

// Memory is what /proc/<pid>/status says of a process's resident memory,
// in bytes.
type Memory struct {
	VmRSS, RssAnon, RssFile int64
}

// Figures are one run's measurements.
type Figures struct {
	// StartToSocket is the time from starting the process to its DRA
	// socket accepting a connection.
	StartToSocket time.Duration
	// Started is the memory once the plugin has published its devices;
	// AfterCycles after the Prepare/Unprepare cycles.
	Started, AfterCycles Memory
	// CPU is the plugin's CPU time (user and system) until after the
	// cycles, in the kernel's clock ticks (normally 10 ms).
	CPU time.Duration
}

// Run starts the plugin, measures it and stops it (SIGTERM, as the
// kubelet stops a pod).
func Run(ctx context.Context, o Options) (Figures, error) {
	var f Figures
	for _, d := range []string{"p", "r", "cdi"} {
		if err := os.MkdirAll(filepath.Join(o.Dir, d), 0o755); err != nil {
			return f, err
		}
	}
	fleet := filepath.Join(o.Dir, "fleet.yaml")
	if err := os.WriteFile(fleet, []byte(fleetYAML), 0o644); err != nil {
		return f, err
	}
	api, err := apiserver.Start()
	if err != nil {
		return f, err
	}
	defer api.Close()
	kubeconfig := filepath.Join(o.Dir, "kubeconfig")
	if err := apiserver.WriteKubeconfig(kubeconfig, api.URL()); err != nil {
		return f, err
	}
	client, err := kubernetes.NewForConfig(apiserver.RESTConfig(api.URL()))
	if err != nil {
		return f, err
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil {
		return f, err
	}

	httpEndpoint, err := freePort()
	if err != nil {
		return f, err
	}
	log, err := os.Create(filepath.Join(o.Dir, "plugin.log"))
	if err != nil {
		return f, err
	}
	defer func() { _ = log.Close() }()
	args := append(append([]string{}, o.Command...),
		"--node-name="+nodeName,
		"--driver-name="+driverName,
		"--kubeconfig="+kubeconfig,
		"--fleet="+fleet,
		"--plugin-data-dir="+filepath.Join(o.Dir, "p"),
		"--registrar-dir="+filepath.Join(o.Dir, "r"),
		"--cdi-dir="+filepath.Join(o.Dir, "cdi"),
		// Metrics and probes, as the chart serves them.
		"--http-endpoint="+httpEndpoint,
	)
	// A copy of the binary written for this run: how much of a file a
	// process's mappings hold resident (RssFile) depends on the page
	// cache's folios of the file, which kernels with large folios make
	// as big as 2 MiB when the file is written, as an image's layer is
	// when a node unpacks it; a file read back after its pages were
	// evicted gets smaller ones. Each run starts from a file just written.
	binary := filepath.Join(o.Dir, filepath.Base(o.Binary))
	if err := copyFile(binary, o.Binary); err != nil {
		return f, err
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = log, log
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return f, fmt.Errorf("start %s: %w", o.Binary, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		// How the plugin exits after the signal is no figure.
		select {
		case <-exited: //nolint:errcheck // see above
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited //nolint:errcheck // see above
		}
	}()
	pid := cmd.Process.Pid
	logTail := func() string { return tail(filepath.Join(o.Dir, "plugin.log"), 20) }

	socket := filepath.Join(o.Dir, "p", "dra.sock")
	if f.StartToSocket, err = waitForSocket(ctx, start, socket, exited); err != nil {
		return f, fmt.Errorf("%w: %s", err, logTail())
	}
	if err := waitForSlices(ctx, client, exited); err != nil {
		return f, fmt.Errorf("%w: %s", err, logTail())
	}
	if f.Started, err = ReadMemory(pid); err != nil {
		return f, err
	}

	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return f, err
	}
	defer func() { _ = conn.Close() }()
	dra := drapb.NewDRAPluginClient(conn)
	for i := range o.Cycles {
		if err := cycle(ctx, client, dra, i); err != nil {
			return f, fmt.Errorf("cycle %d: %w: %s", i, err, logTail())
		}
	}
	if f.AfterCycles, err = ReadMemory(pid); err != nil {
		return f, err
	}
	if f.CPU, err = readCPU(pid); err != nil {
		return f, err
	}
	return f, nil
}

// copyFile copies the executable src to dst.
func copyFile(dst, src string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o755)
}

// freePort returns a loopback address whose port was free a moment ago.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String(), nil
}

// waitForSocket polls the socket path until a connection to it is
// accepted and returns when, as the time since start.
func waitForSocket(ctx context.Context, start time.Time, socket string, exited chan error) (time.Duration, error) {
	deadline := start.Add(time.Minute)
	for {
		if _, err := os.Stat(socket); err == nil {
			if c, err := net.Dial("unix", socket); err == nil {
				d := time.Since(start)
				_ = c.Close()
				return d, nil
			}
		}
		select {
		case err := <-exited:
			exited <- err
			return 0, fmt.Errorf("plugin exited at start (%v)", err)
		case <-ctx.Done():
			return 0, ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			return 0, errors.New("no DRA socket after a minute")
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// waitForSlices waits until the node's pool is published whole.
func waitForSlices(ctx context.Context, client kubernetes.Interface, exited chan error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		devices, count, want := 0, 0, int64(-1)
		for _, s := range list.Items {
			if s.Spec.Pool.Name == nodeName && s.Spec.Driver == driverName {
				count++
				want = s.Spec.Pool.ResourceSliceCount
				devices += len(s.Spec.Devices)
			}
		}
		if count > 0 && int64(count) == want && devices >= gpus {
			return nil
		}
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("plugin exited before publishing (%v)", err)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			return errors.New("no ResourceSlices after a minute")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// cycle is one claim's life on the node: created with its pod, allocated
// to GPU i mod 8, prepared, unprepared, deleted.
func cycle(ctx context.Context, client kubernetes.Interface, dra drapb.DRAPluginClient, i int) error {
	name := fmt.Sprintf("claim-%d", i)
	claims := client.ResourceV1().ResourceClaims(namespace)
	claim, err := claims.Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: deviceclasses.GPU, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	pods := client.CoreV1().Pods(namespace)
	pod, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: "pod-" + name},
		Spec: corev1.PodSpec{
			NodeName:       nodeName,
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &name}},
			Containers: []corev1.Container{{
				Name: "main", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: driverName, Pool: nodeName, Device: fmt.Sprintf("gpu-%d", i%gpus),
	}}}}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if claim, err = claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		return err
	}
	pb := []*drapb.Claim{{Namespace: namespace, Name: name, Uid: string(claim.UID)}}
	prep, err := dra.NodePrepareResources(ctx, &drapb.NodePrepareResourcesRequest{Claims: pb})
	if err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	if r := prep.Claims[string(claim.UID)]; r == nil || r.Error != "" || len(r.Devices) != 1 {
		return fmt.Errorf("prepare: %v", r)
	}
	unprep, err := dra.NodeUnprepareResources(ctx, &drapb.NodeUnprepareResourcesRequest{Claims: pb})
	if err != nil {
		return fmt.Errorf("unprepare: %w", err)
	}
	if r := unprep.Claims[string(claim.UID)]; r == nil || r.Error != "" {
		return fmt.Errorf("unprepare: %v", r)
	}
	if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		return err
	}
	return claims.Delete(ctx, name, metav1.DeleteOptions{})
}

// ReadMemory reads VmRSS, RssAnon and RssFile of process pid.
func ReadMemory(pid int) (Memory, error) {
	var m Memory
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return m, err
	}
	fields := map[string]*int64{"VmRSS": &m.VmRSS, "RssAnon": &m.RssAnon, "RssFile": &m.RssFile}
	s := bufio.NewScanner(bytes.NewReader(data))
	for s.Scan() {
		name, value, ok := strings.Cut(s.Text(), ":")
		dst := fields[name]
		if !ok || dst == nil {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			return m, fmt.Errorf("/proc/%d/status: %s: %w", pid, name, err)
		}
		*dst = kb << 10
		delete(fields, name)
	}
	if len(fields) > 0 {
		return m, fmt.Errorf("/proc/%d/status: no %v", pid, fields)
	}
	return m, nil
}

// readCPU reads the user and system time of process pid from
// /proc/<pid>/stat, in ticks of USER_HZ, which is 100 on every Linux
// architecture gpudra runs on.
func readCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from after it; utime and stime are the stat's 14th and 15th.
	_, rest, ok := strings.Cut(string(data), ") ")
	fields := strings.Fields(rest)
	if !ok || len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too short", pid)
	}
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond, nil
}

// tail returns the last lines of a file.
func tail(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
