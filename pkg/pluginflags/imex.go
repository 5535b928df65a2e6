package pluginflags

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	cdnode "github.com/gpudra/gpudra/pkg/computedomain/node"
	"github.com/gpudra/gpudra/pkg/imex"
	"github.com/gpudra/gpudra/pkg/proctable"
)

// Values of --imex-daemon.
const (
	// IMEXDaemonAuto supervises the node's nvidia-imex when the binary
	// exists, and serves channels only (saying so in the log) when not.
	IMEXDaemonAuto = "auto"
	// IMEXDaemonRequired refuses to start without the binary.
	IMEXDaemonRequired = "required"
	// IMEXDaemonOff serves channels only.
	IMEXDaemonOff = "off"
)

// IMEXFlags configure the node's IMEX daemon, which the ComputeDomain
// channel plugin supervises, and the node's reports in the domains'
// ComputeDomainCliques.
type IMEXFlags struct {
	Daemon         string
	Binary         string
	Ctl            string
	Launcher       string
	NsenterPath    string
	SystemdRunPath string
	Dir            string
	HostsFile      string
	Port           int
	CmdPort        int
	MaxNodes       int
	IdleStop       time.Duration
	// CliqueNamespace is where the nodes report (the driver's namespace).
	CliqueNamespace string
	// NodeIP is the node's address for its IMEX peers.
	NodeIP string
	// DaemonEnv is added to the daemon's environment; no flag sets it
	// (the local cluster's fake daemon learns its node's hosts file
	// through it).
	DaemonEnv []string
}

// AddFlags registers the flags.
func (f *IMEXFlags) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&f.Daemon, "imex-daemon", IMEXDaemonAuto, "supervise the node's nvidia-imex: auto (when --imex-binary exists; channels only otherwise), required (refuse to start without it) or off (channels only)")
	fs.StringVar(&f.Binary, "imex-binary", imex.DaemonName, "the IMEX daemon's program, a path or a name looked up in PATH")
	fs.StringVar(&f.Ctl, "imex-ctl", imex.CtlName, "the IMEX query tool (nvidia-imex-ctl -q answers READY for a ready daemon)")
	fs.StringVar(&f.Launcher, "imex-launcher", imex.LauncherProcess, "how the daemon is started: process (a detached process; a plugin on the host) or systemd-run (a transient unit of the host's systemd; a plugin in a container)")
	fs.StringVar(&f.NsenterPath, "imex-nsenter-path", "", "with --imex-launcher=systemd-run from a container: nsenter's path, to run systemd-run in the host's namespaces (needs hostPID)")
	fs.StringVar(&f.SystemdRunPath, "imex-systemd-run-path", "/usr/bin/systemd-run", "with --imex-launcher=systemd-run: systemd-run's path as the host sees it")
	fs.StringVar(&f.Dir, "imex-dir", "", "directory of the daemon's config, peer list and log (default <plugin-data-dir>/imex); a host path with systemd-run")
	fs.StringVar(&f.HostsFile, "imex-hosts-file", "/etc/hosts", "hosts file whose marked block maps the peers' names (compute-domain-daemon-NNNN) to their IPs; the daemon resolves them through it")
	fs.IntVar(&f.Port, "imex-port", imex.DefaultServerPort, "the daemon's port for its peers (SERVER_PORT); the same on every node")
	fs.IntVar(&f.CmdPort, "imex-cmd-port", imex.DefaultCmdPort, "the daemon's query port on loopback (IMEX_CMD_PORT)")
	fs.IntVar(&f.MaxNodes, "imex-max-nodes", imex.DefaultMaxNodes, "the largest clique: peer names written, and IMEX indices handed out per clique")
	fs.DurationVar(&f.IdleStop, "imex-idle-stop", imex.DefaultIdleStop, "how long the daemon runs on once no channel claim holds it")
	fs.StringVar(&f.CliqueNamespace, "clique-namespace", os.Getenv("POD_NAMESPACE"), "the driver's namespace, where the node reports its IMEX daemon in ComputeDomainCliques and takes its IMEX index (env POD_NAMESPACE)")
	fs.StringVar(&f.NodeIP, "node-ip", os.Getenv("NODE_IP"), "this node's IP for its IMEX peers (env NODE_IP)")
}

// Validate names the flag and the allowed values of every bad setting.
func (f *IMEXFlags) Validate() error {
	switch f.Daemon {
	case IMEXDaemonAuto, IMEXDaemonRequired, IMEXDaemonOff:
	default:
		return fmt.Errorf("--imex-daemon %q: must be %s, %s or %s", f.Daemon, IMEXDaemonAuto, IMEXDaemonRequired, IMEXDaemonOff)
	}
	if f.Daemon == IMEXDaemonOff {
		return nil
	}
	switch f.Launcher {
	case imex.LauncherProcess:
	case imex.LauncherSystemdRun:
		if !filepath.IsAbs(f.SystemdRunPath) {
			return fmt.Errorf("--imex-systemd-run-path %q: must be an absolute path", f.SystemdRunPath)
		}
	default:
		return fmt.Errorf("--imex-launcher %q: must be %s or %s", f.Launcher, imex.LauncherProcess, imex.LauncherSystemdRun)
	}
	switch {
	case f.Binary == "":
		return fmt.Errorf("--imex-binary: must not be empty")
	case f.Ctl == "":
		return fmt.Errorf("--imex-ctl: must not be empty")
	case f.Dir != "" && !filepath.IsAbs(f.Dir):
		return fmt.Errorf("--imex-dir %q: must be an absolute path", f.Dir)
	case !filepath.IsAbs(f.HostsFile):
		return fmt.Errorf("--imex-hosts-file %q: must be an absolute path", f.HostsFile)
	case f.Port < 1 || f.Port > 65535:
		return fmt.Errorf("--imex-port %d: must be 1..65535", f.Port)
	case f.CmdPort < 1 || f.CmdPort > 65535 || f.CmdPort == f.Port:
		return fmt.Errorf("--imex-cmd-port %d: must be 1..65535 and differ from --imex-port", f.CmdPort)
	case f.MaxNodes < 1 || f.MaxNodes > imex.MaxNodesLimit:
		return fmt.Errorf("--imex-max-nodes %d: must be 1..%d", f.MaxNodes, imex.MaxNodesLimit)
	case f.IdleStop < 0:
		return fmt.Errorf("--imex-idle-stop %v: must not be negative", f.IdleStop)
	case f.Daemon == IMEXDaemonRequired:
		return f.validateNode()
	}
	return nil
}

// validateNode checks what a node that runs the daemon needs to report it;
// with auto, only once the binary is found.
func (f *IMEXFlags) validateNode() error {
	switch {
	case f.CliqueNamespace == "":
		return fmt.Errorf("--clique-namespace (or env POD_NAMESPACE) is required to run the IMEX daemon: the node reports it there; --imex-daemon=off serves channels only")
	case net.ParseIP(f.NodeIP) == nil:
		return fmt.Errorf("--node-ip %q (or env NODE_IP): must be the node's IP address to run the IMEX daemon; --imex-daemon=off serves channels only", f.NodeIP)
	}
	return nil
}

// NodeDaemon returns the node's IMEX side, or nil (channels only) when the
// daemon is off, or when it is auto and the binary is missing, which it
// logs. dataDir is the plugin's data directory, the default's parent.
func (f *IMEXFlags) NodeDaemon(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, nodeName, dataDir string) (*cdnode.Daemon, error) {
	logger := klog.FromContext(ctx)
	if f.Daemon == IMEXDaemonOff {
		logger.Info("IMEX daemon supervision is off (--imex-daemon=off): serving IMEX channels only")
		return nil, nil
	}
	if err := imex.Available(f.Binary); err != nil {
		if f.Daemon == IMEXDaemonRequired {
			return nil, fmt.Errorf("--imex-binary: %w (--imex-daemon=required)", err)
		}
		logger.Info("No IMEX daemon binary on this node: serving IMEX channels only; pods of a ComputeDomain here get their channel but no IMEX daemon", "imexBinary", f.Binary, "err", err.Error())
		return nil, nil
	}
	if err := f.validateNode(); err != nil {
		return nil, err
	}
	dir := f.Dir
	if dir == "" {
		dir = filepath.Join(dataDir, "imex")
	}
	var launcher imex.Launcher = imex.ProcessLauncher{}
	if f.Launcher == imex.LauncherSystemdRun {
		launcher = imex.SystemdRunLauncher{SystemdRun: proctable.SystemdRun{NsenterPath: f.NsenterPath, SystemdRunPath: f.SystemdRunPath}}
	}
	return cdnode.NewDaemon(cdnode.DaemonConfig{
		Supervisor: imex.Options{
			Config:   imex.Config{Dir: dir, NodeIP: f.NodeIP, ServerPort: f.Port, CmdPort: f.CmdPort, MaxNodes: f.MaxNodes},
			Binary:   f.Binary,
			Ctl:      f.Ctl,
			Launcher: launcher,
			Env:      f.DaemonEnv,
			IdleStop: f.IdleStop,
		},
		Reporter: cdnode.ReporterConfig{
			Dynamic:   dyn,
			Indices:   &cdnode.IndexRegistry{Client: kube, Namespace: f.CliqueNamespace, MaxNodes: f.MaxNodes},
			Namespace: f.CliqueNamespace,
			NodeName:  nodeName,
			NodeIP:    f.NodeIP,
		},
		HostsFile: f.HostsFile,
	})
}
