// Package containerruntime runs the container runtime of a real node in
// the local cluster: containerd 2.x with its CRI plugin (CDI on, the
// node's CDI spec directories), runc with cgroupfs, a bridge pod network,
// and the pause image, all under one node directory. The kubelet of the
// node talks to it at [Runtime.Endpoint].
//
// The programs are built from Go modules ([BuildBinaries]); images are
// built on this machine and imported from archives ([Runtime.Import]), so
// nothing is pulled from a registry.
package containerruntime

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
)

// CRINamespace is containerd's namespace of the CRI plugin, into which
// images for pods are imported.
const CRINamespace = "k8s.io"

// Config says where and how a node's runtime runs.
type Config struct {
	// Dir is the node directory: containerd's root, state, socket,
	// configuration and log, runc's state and the CNI configuration lie
	// under it. It is bind-mounted onto itself with shared propagation
	// for as long as the runtime runs (the kubelet's pod volumes and
	// containers' mount propagation need a shared mount).
	Dir string
	// CDIDirs are the CDI spec directories: where the node's gpudra
	// writes its specs.
	CDIDirs []string
	// Binaries are the programs, from [BuildBinaries].
	Binaries Binaries
	// PodCIDR is the node's pod network; default 10.88.0.0/24. Nodes of
	// one machine need distinct ones.
	PodCIDR string
	// Bridge is the node's bridge interface (at most 15 characters);
	// default "gpudra0". Nodes of one machine need distinct ones.
	Bridge string
	// SnapshotterRoot is where the overlayfs snapshotter keeps layers.
	// By default it lies under Dir, or, when Dir lies on overlayfs
	// (on which overlayfs cannot stack), in a directory under /dev/shm
	// that Stop removes. A SnapshotterRoot on overlayfs is refused.
	SnapshotterRoot string
	// ReadyTimeout bounds the wait for the CRI to report ready; default
	// one minute.
	ReadyTimeout time.Duration
}

// Runtime is one running containerd of a real node.
type Runtime struct {
	cfg    Config
	layout layout
	cmd    *exec.Cmd
	exited chan struct{}
	// ownedSnapshots is the snapshotter's directory under /dev/shm
	// that Start made because Dir lies on overlayfs; Stop removes it.
	ownedSnapshots string
	log            *os.File
	conn           *grpc.ClientConn
	cri            runtimeapi.RuntimeServiceClient

	stopOnce sync.Once
	stopErr  error
}

// Start checks the machine, writes the configuration, bind-mounts Dir
// onto itself with shared propagation, starts containerd, waits until its
// CRI reports the runtime and the network ready, and imports the pause
// image. The runtime runs until Stop; cancelling ctx only aborts the
// start.
func Start(ctx context.Context, cfg Config) (*Runtime, error) {
	logger := klog.FromContext(ctx)
	if err := cfg.complete(); err != nil {
		return nil, err
	}
	if err := CheckMachine(cfg.Dir); err != nil {
		return nil, err
	}
	l := layout{dir: cfg.Dir}
	for _, d := range append([]string{l.root(), l.state(), l.runcRoot(), l.imagesDir()}, cfg.CDIDirs...) {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("real node runtime: %w", err)
		}
	}
	r := &Runtime{layout: l, exited: make(chan struct{})}
	root, owned, err := snapshotterRoot(l, cfg.SnapshotterRoot)
	if err != nil {
		return nil, err
	}
	cfg.SnapshotterRoot = root
	if owned {
		r.ownedSnapshots = root
		logger.Info("The node directory lies on overlayfs; the overlayfs snapshotter keeps its layers in /dev/shm", "dir", root)
	}
	r.cfg = cfg
	err = writeContainerdConfig(l, cfg)
	if err == nil {
		err = writeCNIConfig(l, cfg)
	}
	if err == nil {
		err = shareMount(cfg.Dir)
	}
	if err != nil {
		_ = os.RemoveAll(r.ownedSnapshots)
		return nil, err
	}
	if err := r.start(ctx); err != nil {
		_ = r.stop(logger) // the start's error is the one to report
		return nil, err
	}
	pause, err := WritePauseImage(l.imagesDir(), cfg.Binaries)
	if err == nil {
		err = r.Import(ctx, pause)
	}
	if err != nil {
		_ = r.stop(logger) // the start's error is the one to report
		return nil, err
	}
	logger.Info("Real node runtime ready", "endpoint", r.Endpoint(), "dir", cfg.Dir)
	return r, nil
}

func (cfg *Config) complete() error {
	if cfg.Dir == "" {
		return errors.New("real node runtime: Config.Dir is empty")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return fmt.Errorf("real node runtime: Config.Dir: %w", err)
	}
	cfg.Dir = dir
	// A unix socket path is at most 107 bytes.
	if n := len(layout{dir: dir}.socket() + ".ttrpc"); n > 107 {
		return fmt.Errorf("real node runtime: Config.Dir %s is too long for containerd's socket (%d bytes, at most 107)", dir, n)
	}
	if cfg.Binaries.Dir == "" || cfg.Binaries.Runc == "" {
		return errors.New("real node runtime: Config.Binaries is empty (use BuildBinaries)")
	}
	if !complete(cfg.Binaries) {
		return fmt.Errorf("real node runtime: Config.Binaries: %s lacks some of %s", cfg.Binaries.Dir, strings.Join(binaryNames, ", "))
	}
	if cfg.PodCIDR == "" {
		cfg.PodCIDR = "10.88.0.0/24"
	}
	if _, _, err := net.ParseCIDR(cfg.PodCIDR); err != nil {
		return fmt.Errorf("real node runtime: Config.PodCIDR: %w", err)
	}
	if cfg.Bridge == "" {
		cfg.Bridge = "gpudra0"
	}
	if len(cfg.Bridge) > 15 {
		return fmt.Errorf("real node runtime: Config.Bridge %q is longer than 15 characters", cfg.Bridge)
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = time.Minute
	}
	return nil
}

func (r *Runtime) start(ctx context.Context) error {
	l := r.layout
	log, err := os.OpenFile(l.logFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("real node runtime: %w", err)
	}
	r.log = log
	// Not CommandContext: containerd outlives the start's context and
	// is stopped by Stop, with SIGTERM.
	cmd := exec.Command(r.cfg.Binaries.path("containerd"), "--config", l.configFile())
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "PATH="+r.cfg.Binaries.Dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	// Its own process group: a Ctrl-C meant for the test must not kill
	// containerd before Stop removes the pods.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("real node runtime: start containerd: %w", err)
	}
	r.cmd = cmd
	go func() {
		_ = cmd.Wait()
		close(r.exited)
	}()
	// The first connection attempts fail until containerd has created
	// its socket; a short backoff keeps the wait short.
	conn, err := grpc.NewClient("unix://"+l.socket(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		return fmt.Errorf("real node runtime: CRI client: %w", err)
	}
	r.conn = conn
	r.cri = runtimeapi.NewRuntimeServiceClient(conn)
	return r.waitReady(ctx)
}

// waitReady polls the CRI status until the runtime and the network are
// ready; containerd exiting, ctx ending or ReadyTimeout passing end the
// wait with the last reason, and the log's tail.
func (r *Runtime) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.ReadyTimeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		err := r.ready(ctx)
		if err == nil {
			return nil
		}
		// The call that ctx's end cut short says less than the one
		// before it.
		if last == nil || ctx.Err() == nil {
			last = err
		}
		select {
		case <-r.exited:
			return fmt.Errorf("real node runtime: containerd exited (%v) before its CRI was ready: %w\n%s", r.cmd.ProcessState, last, r.logTail())
		case <-ctx.Done():
			return fmt.Errorf("real node runtime: CRI not ready: %w (%w)\n%s", last, ctx.Err(), r.logTail())
		case <-tick.C:
		}
	}
}

func (r *Runtime) ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := r.cri.Status(ctx, &runtimeapi.StatusRequest{})
	if err != nil {
		return err
	}
	// The conditions the kubelet waits for; others (containerd's
	// deprecation warnings about cgroup v1) do not stop a node.
	var notReady []string
	for _, want := range []string{runtimeapi.RuntimeReady, runtimeapi.NetworkReady} {
		i := slices.IndexFunc(st.GetStatus().GetConditions(), func(c *runtimeapi.RuntimeCondition) bool { return c.Type == want })
		switch {
		case i < 0:
			notReady = append(notReady, want+": not reported")
		case !st.Status.Conditions[i].Status:
			c := st.Status.Conditions[i]
			notReady = append(notReady, fmt.Sprintf("%s: %s %s", c.Type, c.Reason, c.Message))
		}
	}
	if len(notReady) > 0 {
		return errors.New(strings.Join(notReady, "; "))
	}
	return nil
}

// logTail is the end of containerd's log, for errors.
func (r *Runtime) logTail() string {
	b, err := os.ReadFile(r.layout.logFile())
	if err != nil {
		return ""
	}
	const n = 4000
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// Endpoint is the CRI endpoint, as the kubelet's --container-runtime-endpoint
// and the CRI clients take it: unix://<Dir>/containerd.sock.
func (r *Runtime) Endpoint() string { return "unix://" + r.layout.socket() }

// Dir is the node directory.
func (r *Runtime) Dir() string { return r.cfg.Dir }

// LogFile is containerd's log.
func (r *Runtime) LogFile() string { return r.layout.logFile() }

// Import imports an image archive (docker save or OCI format, as
// imagebuild writes them) into the CRI's namespace, with ctr.
func (r *Runtime) Import(ctx context.Context, archive string) error {
	cmd := exec.CommandContext(ctx, r.cfg.Binaries.path("ctr"), "--address", r.layout.socket(),
		"--namespace", CRINamespace, "images", "import", "--local", archive)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("real node runtime: import %s: %w\n%s", archive, err, out)
	}
	klog.FromContext(ctx).V(2).Info("Imported image", "archive", archive)
	return nil
}

// Stop removes every pod sandbox (so their shims and mounts go), stops
// containerd with SIGTERM (SIGKILL after 10 s), unmounts what is left
// under Dir and Dir's own bind mount, and deletes the bridge. It is safe
// to call more than once.
func (r *Runtime) Stop() error {
	r.stopOnce.Do(func() { r.stopErr = r.stop(klog.Background()) })
	return r.stopErr
}

func (r *Runtime) stop(logger klog.Logger) error {
	var errs []error
	if r.cri != nil {
		errs = append(errs, r.removePods())
	}
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(10 * time.Second):
			logger.Info("containerd did not stop on SIGTERM; killing it", "pid", r.cmd.Process.Pid)
			_ = r.cmd.Process.Kill()
			<-r.exited
		}
	}
	if r.conn != nil {
		_ = r.conn.Close()
	}
	if r.log != nil {
		_ = r.log.Close()
	}
	errs = append(errs, unmountUnder(r.cfg.Dir), deleteLink(r.cfg.Bridge))
	if r.ownedSnapshots != "" {
		errs = append(errs, unmountUnder(r.ownedSnapshots), os.RemoveAll(r.ownedSnapshots))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("real node runtime: stop: %w", err)
	}
	return nil
}

// removePods stops and removes every pod sandbox, which stops their
// containers and shims.
func (r *Runtime) removePods() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := r.cri.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return nil // containerd never answered: nothing to remove
	}
	var errs []error
	for _, s := range resp.Items {
		if _, err := r.cri.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: s.Id}); err != nil {
			errs = append(errs, fmt.Errorf("stop pod sandbox %s: %w", s.Id, err))
			continue
		}
		if _, err := r.cri.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: s.Id}); err != nil {
			errs = append(errs, fmt.Errorf("remove pod sandbox %s: %w", s.Id, err))
		}
	}
	return errors.Join(errs...)
}

// deleteLink deletes the node's bridge, which the bridge plugin creates
// and never removes.
func deleteLink(name string) error {
	if _, err := net.InterfaceByName(name); err != nil {
		return nil
	}
	if out, err := exec.Command("ip", "link", "delete", name).CombinedOutput(); err != nil {
		return fmt.Errorf("delete bridge %s: %w: %s", name, err, out)
	}
	return nil
}
