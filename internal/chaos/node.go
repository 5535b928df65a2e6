package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/gpudra/gpudra/api/resource/v1beta1"
	"github.com/gpudra/gpudra/internal/cutproxy"
	"github.com/gpudra/gpudra/internal/mpsfake"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
)

// Names of the simulated node.
const (
	driverName = v1beta1.GPUDriverName
	nodeName   = "chaos-0"
	namespace  = "default"
)

// fleetYAML is the simulated node: six H100s, two of them in MIG mode for
// dynamic MIG; every GPU has an IOMMU group, so it is also offered for
// VFIO passthrough beside its CUDA devices.
const fleetYAML = `nodes:
- name: chaos-0
  gpus:
  - model: H100-SXM5-80GB
  - model: H100-SXM5-80GB
  - model: H100-SXM5-80GB
    migEnabled: true
  - model: H100-SXM5-80GB
  - model: H100-SXM5-80GB
    migEnabled: true
  - model: H100-SXM5-80GB
`

// profile is how the node's plugin shares full GPUs.
type profile string

const (
	// profileExclusive: full GPUs go to one claim each (time-slicing and
	// MPS by claim config).
	profileExclusive profile = "exclusive"
	// profileShared: full GPUs are published for any number of claims
	// (--sharing=unlimited): shares that ask for memory get capped MPS
	// daemons, the others may time-slice or ask for MPS.
	profileShared profile = "shared"
)

// node is one simulated GPU node: directories that outlive the plugin
// process (checkpoint, CDI specs, the simulated hardware's state, MPS
// daemons), the API server with the outage proxy in front of it, and the
// plugin process.
type node struct {
	dir         string
	binary      string
	mpsControl  string
	profile     profile
	callTimeout time.Duration

	api    APIServer
	proxy  *cutproxy.Proxy
	client kubernetes.Interface // the harness's, straight to the API server

	// proc is the plugin instance the kubelet talks to; podUID its pod's
	// UID (empty: the helper's plain socket dra.sock), which a rolling
	// update changes (rolling.go).
	proc
	podUID string
	starts int
	// closeErr is the API server's Close error: a shared one that could
	// not be cleaned for the next trial.
	closeErr error
}

// proc is one plugin process and the kubelet's connection to it.
type proc struct {
	cmd    *exec.Cmd
	exited chan error // the plugin process's exit, once
	conn   *grpc.ClientConn
	dra    drapb.DRAPluginClient
	log    int // its log is logPath(log)
}

func (n *node) pluginDir() string { return filepath.Join(n.dir, "p") }
func (n *node) cdiDir() string    { return filepath.Join(n.dir, "cdi") }
func (n *node) simDir() string    { return filepath.Join(n.dir, "sim") }
func (n *node) mpsRoot() string   { return filepath.Join(n.dir, "m") }

// socket is the DRA socket of the instance of a pod: the kubeletplugin
// helper names it after the pod's UID when rolling updates are enabled.
func (n *node) socket(podUID string) string {
	if podUID == "" {
		return filepath.Join(n.pluginDir(), "dra.sock")
	}
	return filepath.Join(n.pluginDir(), "dra-"+podUID+".sock")
}
func (n *node) logPath(i int) string {
	return filepath.Join(n.dir, fmt.Sprintf("plugin-%02d.log", i))
}

// newNode sets up the node's directories, API server (from newAPI) and
// proxy; the plugin is started by start.
func newNode(ctx context.Context, newAPI APIServerFactory, dir, binary, mpsControl string, p profile, callTimeout time.Duration) (_ *node, finalErr error) {
	n := &node{dir: dir, binary: binary, mpsControl: mpsControl, profile: p, callTimeout: callTimeout}
	for _, d := range []string{n.pluginDir(), n.cdiDir(), n.simDir(), n.mpsRoot(), filepath.Join(n.dir, "r")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.WriteFile(filepath.Join(n.dir, "fleet.yaml"), []byte(fleetYAML), 0o644); err != nil {
		return nil, err
	}
	if newAPI == nil {
		newAPI = startInRepoAPIServer
	}
	var err error
	if n.api, err = newAPI(ctx); err != nil {
		return nil, fmt.Errorf("API server: %w", err)
	}
	if n.proxy, err = cutproxy.Start(n.api.Addr()); err != nil {
		_ = n.api.Close()
		return nil, err
	}
	defer func() {
		if finalErr != nil {
			n.stop()
		}
	}()
	if err := n.api.WriteKubeconfig(filepath.Join(n.dir, "kubeconfig"), n.proxy.Addr()); err != nil {
		return nil, err
	}
	if n.client, err = kubernetes.NewForConfig(n.api.RESTConfig()); err != nil {
		return nil, err
	}
	// A shared API server may have the Node from an earlier trial.
	if _, err = n.client.CoreV1().Nodes().Create(ctx, nodeObject(), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	return n, nil
}

// nodeObject is the simulated node's Node, as its kubelet registers it
// (a real API server requires what the scheduler reads of it).
func nodeObject() *corev1.Node {
	capacity := corev1.ResourceList{
		corev1.ResourcePods:   resource.MustParse("110"),
		corev1.ResourceCPU:    resource.MustParse("64"),
		corev1.ResourceMemory: resource.MustParse("512Gi"),
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName, Labels: map[string]string{corev1.LabelHostname: nodeName}},
		Status:     corev1.NodeStatus{Capacity: capacity, Allocatable: capacity},
	}
}

// args are the plugin's command line for the instance of a pod.
func (n *node) args(podUID string) []string {
	sharing := "none"
	if n.profile == profileShared {
		sharing = "unlimited"
	}
	return []string{
		"kubelet-plugin",
		"--node-name=" + nodeName,
		"--kubeconfig=" + filepath.Join(n.dir, "kubeconfig"),
		"--fleet=" + filepath.Join(n.dir, "fleet.yaml"),
		"--sim-state-dir=" + n.simDir(),
		"--plugin-data-dir=" + n.pluginDir(),
		"--registrar-dir=" + filepath.Join(n.dir, "r"),
		"--cdi-dir=" + n.cdiDir(),
		"--mps-root=" + n.mpsRoot(),
		"--mps-control-binary=" + n.mpsControl,
		"--sharing=" + sharing,
		"--vfio=beside",
		"--sweep-interval=1s",
		"--kubelet-call-timeout=" + n.callTimeout.String(),
		"--pod-uid=" + podUID,
		"-v=4",
	}
}

// start starts the plugin process and waits until it answers DRA calls.
func (n *node) start(ctx context.Context) error {
	if err := n.spawn(); err != nil {
		return err
	}
	return n.ready(ctx)
}

// spawn starts the plugin process of the node's pod.
func (n *node) spawn() error {
	p, err := n.spawnInstance(n.podUID)
	if err != nil {
		return err
	}
	n.proc = *p
	return nil
}

// spawnInstance starts a plugin process for a pod: a second one, beside
// the node's, is a rolling update.
func (n *node) spawnInstance(podUID string) (*proc, error) {
	n.starts++
	p := &proc{log: n.starts}
	log, err := os.Create(n.logPath(p.log))
	if err != nil {
		return nil, err
	}
	defer func() { _ = log.Close() }() // the child has its own descriptor
	cmd := exec.Command(n.binary, n.args(podUID)...)
	cmd.Stdout, cmd.Stderr = log, log
	// MPS daemons outlive the plugin, as on a node; a failed trial's
	// daemons end with their directories or after this long.
	cmd.Env = append(os.Environ(), mpsfake.EnvMaxLifetime+"=20m")
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start plugin: %w", err)
	}
	p.cmd = cmd
	exited := make(chan error, 1)
	p.exited = exited
	go func() { exited <- cmd.Wait() }()
	// The socket appears once the plugin serves: retry the connection
	// at once, not after gRPC's default backoff of a second.
	conn, err := grpc.NewClient("unix://"+n.socket(podUID), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.5, MaxDelay: 100 * time.Millisecond}, MinConnectTimeout: time.Second}))
	if err != nil {
		_ = cmd.Process.Kill()
		<-exited //nolint:errcheck // the kill is the error reported
		return nil, err
	}
	p.conn, p.dra = conn, drapb.NewDRAPluginClient(conn)
	return p, nil
}

// ready waits until the node's plugin process answers DRA calls.
func (n *node) ready(ctx context.Context) error { return n.readyProc(ctx, &n.proc) }

// readyProc waits until a plugin process answers DRA calls.
func (n *node) readyProc(ctx context.Context, p *proc) error {
	exited := p.exited
	deadline := time.Now().Add(60 * time.Second)
	for {
		callCtx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := p.dra.NodePrepareResources(callCtx, &drapb.NodePrepareResourcesRequest{})
		cancel()
		if err == nil {
			return nil
		}
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("plugin exited at start (%v): %s", err, n.logTail(p.log, 20))
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("plugin does not answer DRA calls after a minute: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill SIGKILLs the node's plugin process and waits for it to be gone.
// It returns the exit error of a process that had already exited by
// itself (a crash, not the kill), nil otherwise.
func (n *node) kill() error { return n.end(&n.proc, syscall.SIGKILL) }

// end stops a plugin process with sig and waits for it to be gone (a
// SIGTERM that is not obeyed within 10 s is followed by a SIGKILL). It
// returns the exit error of a process that had already exited by itself.
func (n *node) end(p *proc, sig syscall.Signal) error {
	if p.cmd == nil {
		return nil
	}
	var crashed error
	select {
	case err := <-p.exited:
		crashed = fmt.Errorf("plugin exited by itself (%v): %s", err, n.logTail(p.log, 30))
	default:
		_ = p.cmd.Process.Signal(sig)
		// How the plugin exited after a signal is not a finding.
		select {
		case <-p.exited: //nolint:errcheck // see above
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.exited //nolint:errcheck // see above
		}
	}
	_ = p.conn.Close()
	p.cmd, p.conn, p.dra = nil, nil, nil
	return crashed
}

// running reports whether the node's plugin process is up.
func (n *node) running() bool { return n.proc.running() }

// running reports whether the process is up.
func (p *proc) running() bool {
	if p.cmd == nil {
		return false
	}
	select {
	case err := <-p.exited:
		p.exited <- err
		return false
	default:
		return true
	}
}

// stop ends the plugin (SIGTERM, as the kubelet stops a pod), the proxy
// and the API server. The directories stay for the caller to inspect or
// remove.
func (n *node) stop() {
	_ = n.end(&n.proc, syscall.SIGTERM)
	if n.proxy != nil {
		n.proxy.Close()
	}
	if err := n.api.Close(); err != nil {
		n.closeErr = err
	}
}

// logTail returns the last lines of the log of the i-th plugin start.
func (n *node) logTail(i, lines int) string {
	data, err := os.ReadFile(n.logPath(i))
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// logLine returns the first line of the log of the i-th plugin start
// that holds one of subs, "" when none does.
func (n *node) logLine(i int, subs ...string) string {
	data, err := os.ReadFile(n.logPath(i))
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(data)) {
		for _, s := range subs {
			if strings.Contains(line, s) {
				return strings.TrimSpace(line)
			}
		}
	}
	return ""
}

// logContains reports whether the log of the i-th plugin start holds s.
func (n *node) logContains(i int, s string) bool {
	data, err := os.ReadFile(n.logPath(i))
	return err == nil && bytes.Contains(data, []byte(s))
}

// hardwarePaths of the simulated node's state.
func (n *node) nvmlState() string       { return filepath.Join(n.simDir(), sim.NVMLStateFile) }
func (n *node) sysfsState() string      { return filepath.Join(n.simDir(), sim.SysfsStateFile) }
func (n *node) timeSlicesState() string { return filepath.Join(n.simDir(), sim.TimeSlicesStateFile) }

// buildBinary builds gpudra-node, which the chart's DaemonSet runs, into dir, with the race detector when this
// program has it, and returns its path.
func buildBinary(ctx context.Context, dir string) (string, error) {
	root, err := moduleRoot(ctx)
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "gpudra-node")
	args := []string{"build", "-tags", "grpcnotrace", "-o", out}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.CommandContext(ctx, "go", append(args, "./cmd/gpudra-node")...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if os.Getenv("CGO_CFLAGS") == "" {
		// go-nvml's header marks calls deprecated that the bindings wrap.
		cmd.Env = append(cmd.Env, "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
	}
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/gpudra-node: %w: %s", err, msg)
	}
	return out, nil
}

// moduleRoot is the directory of the driver module, from the driver
// module itself or from a module that requires it (the local cluster's,
// which replaces it with ../).
func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", driverModule).Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w (run from the gpudra or localcluster module)", driverModule, err)
	}
	dir := strings.TrimSpace(string(out))
	if dir == "" {
		return "", errors.New("the gpudra module has no directory: run from the gpudra or localcluster module")
	}
	return dir, nil
}

// driverModule is the path of the module that holds cmd/gpudra-node.
const driverModule = "github.com/gpudra/gpudra"

// pidAlive reports whether pid is a live process (not a zombie).
func pidAlive(pid int) bool { return pid > 0 && mpsfake.Alive(pid) }
