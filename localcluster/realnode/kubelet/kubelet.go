package kubelet

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
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
	"k8s.io/klog/v2"
)

// Config describes one real kubelet.
type Config struct {
	// Binary is the kubelet executable (see Build).
	Binary string
	// NodeName is the Node's name (--hostname-override).
	NodeName string
	// RootDir is --root-dir: pods/, plugins/ and plugins_registry/ below
	// it. A DRA plugin's sockets live under it and a unix socket path
	// must fit in 108 bytes, so keep it short.
	RootDir string
	// PodLogsDir is where the runtime writes container logs
	// (podLogsDir).
	PodLogsDir string
	// Kubeconfig is the client configuration of the API server.
	Kubeconfig string
	// RuntimeEndpoint is the CRI endpoint (unix:///...).
	RuntimeEndpoint string
	// Labels are the Node's labels (--node-labels); Taints its taints
	// at registration (registerWithTaints).
	Labels map[string]string
	Taints []corev1.Taint
	// CertFile and KeyFile are the kubelet API's serving certificate and
	// key (see controlplane.ControlPlane.WriteKubeletServingCert).
	CertFile, KeyFile string
	// Port is the kubelet API's port on 127.0.0.1; 0: a free one, chosen
	// at Start and kept in Kubelet.Config for a restart.
	Port int
	// HealthzPort is the healthz port on 127.0.0.1; 0: a free one.
	HealthzPort int
	// LogFile receives the kubelet's output (appended: a restarted
	// kubelet writes after the old one). Empty: <RootDir>/kubelet.log.
	LogFile string
	// Verbosity is the kubelet's --v.
	Verbosity int
}

// Validate says which required field is missing.
func (c *Config) Validate() error {
	for _, f := range []struct{ name, value string }{
		{"Binary", c.Binary}, {"NodeName", c.NodeName}, {"RootDir", c.RootDir}, {"PodLogsDir", c.PodLogsDir},
		{"Kubeconfig", c.Kubeconfig}, {"RuntimeEndpoint", c.RuntimeEndpoint}, {"CertFile", c.CertFile}, {"KeyFile", c.KeyFile},
	} {
		if f.value == "" {
			return fmt.Errorf("kubelet config: %s is required", f.name)
		}
	}
	if !strings.HasPrefix(c.RuntimeEndpoint, "unix://") {
		return fmt.Errorf("kubelet config: RuntimeEndpoint %q: want unix:///<socket>", c.RuntimeEndpoint)
	}
	return nil
}

// Kubelet is a running kubelet process.
type Kubelet struct {
	cfg  Config
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  *os.File
}

// Start writes the kubelet's configuration under RootDir and starts it.
// It returns once the process runs; WaitReady waits for its Node. The
// process outlives ctx: it stops in Stop. Containers it started keep
// running after Stop, as on any node whose kubelet restarts.
func Start(ctx context.Context, cfg Config) (*Kubelet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	for _, dir := range []string{cfg.RootDir, cfg.PodLogsDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return nil, fmt.Errorf("kubelet %s: %w", cfg.NodeName, err)
		}
	}
	var err error
	if cfg.Port == 0 {
		if cfg.Port, err = freePort(); err != nil {
			return nil, fmt.Errorf("kubelet %s: %w", cfg.NodeName, err)
		}
	}
	if cfg.HealthzPort == 0 {
		if cfg.HealthzPort, err = freePort(); err != nil {
			return nil, fmt.Errorf("kubelet %s: %w", cfg.NodeName, err)
		}
	}
	conf, err := configuration(cfg, cfg.Port, cfg.HealthzPort)
	if err != nil {
		return nil, err
	}
	confFile := filepath.Join(cfg.RootDir, "kubelet-config.yaml")
	if err := os.WriteFile(confFile, conf, 0o600); err != nil {
		return nil, fmt.Errorf("kubelet %s: %w", cfg.NodeName, err)
	}
	if cfg.LogFile == "" {
		cfg.LogFile = filepath.Join(cfg.RootDir, "kubelet.log")
	}
	log, err := os.OpenFile(cfg.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("kubelet %s: log: %w", cfg.NodeName, err)
	}
	cmd := exec.Command(cfg.Binary, args(cfg, confFile)...)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group: a terminal's Ctrl-C reaches the program
	// running the cluster, which stops the kubelet in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := saveTunables(); err != nil {
		log.Close()
		return nil, fmt.Errorf("kubelet %s: %w", cfg.NodeName, err)
	}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, errors.Join(fmt.Errorf("kubelet %s: start %s: %w", cfg.NodeName, cfg.Binary, err), restoreTunables())
	}
	k := &Kubelet{cfg: cfg, cmd: cmd, done: make(chan struct{}), log: log}
	go func() {
		k.err = cmd.Wait()
		log.Close()
		close(k.done)
	}()
	klog.FromContext(ctx).V(2).Info("Started the kubelet", "node", cfg.NodeName, "pid", cmd.Process.Pid, "port", cfg.Port, "log", cfg.LogFile)
	return k, nil
}

// args returns the kubelet's command line: what the configuration file
// cannot say.
func args(cfg Config, confFile string) []string {
	a := []string{
		"--config=" + confFile,
		"--kubeconfig=" + cfg.Kubeconfig,
		"--root-dir=" + cfg.RootDir,
		"--hostname-override=" + cfg.NodeName,
		"--v=" + strconv.Itoa(cfg.Verbosity),
	}
	if len(cfg.Labels) > 0 {
		var labels []string
		for _, k := range slices.Sorted(maps.Keys(cfg.Labels)) {
			labels = append(labels, k+"="+cfg.Labels[k])
		}
		a = append(a, "--node-labels="+strings.Join(labels, ","))
	}
	return a
}

// freePort returns a TCP port on 127.0.0.1 that nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Config returns the configuration in effect, ports and log file filled
// in: Start(ctx, k.Config()) restarts the same kubelet.
func (k *Kubelet) Config() Config { return k.cfg }

// Pid returns the kubelet's process ID.
func (k *Kubelet) Pid() int { return k.cmd.Process.Pid }

// Done is closed when the process has exited.
func (k *Kubelet) Done() <-chan struct{} { return k.done }

// Stop stops the kubelet with SIGTERM, and SIGKILL if it has not exited
// after 20 s, and waits for it. An exit caused by the signal is no error.
// The last kubelet to stop puts back the machine's sysctls (see
// kernelTunables). Stop a Kubelet once.
func (k *Kubelet) Stop() error {
	err := k.stop()
	return errors.Join(err, restoreTunables())
}

func (k *Kubelet) stop() error {
	select {
	case <-k.done:
		return k.exitError()
	default:
	}
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.done:
	case <-time.After(20 * time.Second):
		_ = k.cmd.Process.Kill()
		<-k.done
	}
	var exit *exec.ExitError
	if errors.As(k.err, &exit) && !exit.Exited() {
		return nil
	}
	return k.exitError()
}

func (k *Kubelet) exitError() error {
	if k.err != nil {
		return fmt.Errorf("kubelet %s: %w (log: %s)", k.cfg.NodeName, k.err, k.cfg.LogFile)
	}
	return nil
}

// WaitReady waits until the kubelet's Node reports Ready, or the kubelet
// exits, or ctx ends; the error names the Node's last Ready condition and
// the kubelet's log.
func (k *Kubelet) WaitReady(ctx context.Context, client kubernetes.Interface) error {
	var last string
	err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		select {
		case <-k.done:
			return false, fmt.Errorf("the kubelet exited: %w", k.exitError())
		default:
		}
		node, err := client.CoreV1().Nodes().Get(ctx, k.cfg.NodeName, metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				last = fmt.Sprintf("Ready=%s (%s: %s)", c.Status, c.Reason, c.Message)
				return c.Status == corev1.ConditionTrue, nil
			}
		}
		last = "no Ready condition yet"
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("node %s: wait for Ready (last: %s; kubelet log %s): %w", k.cfg.NodeName, last, k.cfg.LogFile, err)
	}
	return nil
}
