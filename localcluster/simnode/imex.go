package simnode

import (
	"context"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpudra/gpudra/pkg/computedomain"
	"github.com/gpudra/gpudra/pkg/imex"
	"github.com/gpudra/gpudra/pkg/imex/imexfake"
)

// IMEXConfig is the IMEX daemon side of a node's channel plugin: what the
// plugin's IMEX flags give on a real node.
type IMEXConfig struct {
	// Binary and Ctl are nvidia-imex and nvidia-imex-ctl (the fakes in
	// the local cluster).
	Binary, Ctl string
	// Dynamic is the client for ComputeDomainCliques.
	Dynamic dynamic.Interface
	// Namespace is the clique namespace.
	Namespace string
	// NodeIP is the node's address for its peers; the fake daemon binds
	// its server port there.
	NodeIP string
	// ServerPort and CmdPort are the daemon's ports: every simulated
	// node's daemon runs on this one machine, so each needs its own.
	ServerPort, CmdPort int
	// MaxNodes is the peer names written (--imex-max-nodes).
	MaxNodes int
	// IdleStop is how long a daemon no claim holds runs on.
	IdleStop time.Duration
}

// imexRun is a node's running IMEX side.
type imexRun struct {
	mu     sync.Mutex
	daemon *computedomain.NodeDaemon
	cancel context.CancelFunc
	done   chan struct{}
}

// IMEXDir is where the node's IMEX daemon keeps its config, peer list and
// log.
func (n *Node) IMEXDir() string { return filepath.Join(n.cfg.Dir, "imex") }

// IMEXHostsFile is the node's hosts file, whose marked block maps its
// peers' names; the fake daemon resolves them through it.
func (n *Node) IMEXHostsFile() string { return filepath.Join(n.cfg.Dir, "hosts") }

// startIMEX builds and runs the node's IMEX side.
func (n *Node) startIMEX(client kubernetes.Interface, cfg *IMEXConfig) (*computedomain.NodeDaemon, error) {
	d, err := computedomain.NewNodeDaemon(computedomain.NodeDaemonConfig{
		Supervisor: imex.Options{
			Config: imex.Config{Dir: n.IMEXDir(), NodeIP: cfg.NodeIP, ServerPort: cfg.ServerPort, CmdPort: cfg.CmdPort, MaxNodes: cfg.MaxNodes},
			Binary: cfg.Binary,
			Ctl:    cfg.Ctl,
			// The fake resolves names through the node's hosts file; the
			// real daemon would use the node's resolver.
			Env:      []string{imexfake.EnvHostsFile + "=" + n.IMEXHostsFile()},
			IdleStop: cfg.IdleStop,
		},
		Reporter: computedomain.ReporterConfig{
			Dynamic:   cfg.Dynamic,
			Indices:   &computedomain.IndexRegistry{Client: client, Namespace: cfg.Namespace, MaxNodes: cfg.MaxNodes},
			Namespace: cfg.Namespace,
			NodeName:  n.cfg.Name,
			NodeIP:    cfg.NodeIP,
		},
		HostsFile: n.IMEXHostsFile(),
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(n.ctx)
	run := &imexRun{daemon: d, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(run.done)
		if err := d.Run(ctx); err != nil {
			n.logger.Error(err, "IMEX daemon supervision ended")
		}
	}()
	n.pluginMu.Lock()
	n.imex = run
	n.pluginMu.Unlock()
	return d, nil
}

// IMEX returns the node's IMEX side, nil when its channel plugin runs
// without one.
func (n *Node) IMEX() *computedomain.NodeDaemon {
	n.pluginMu.Lock()
	defer n.pluginMu.Unlock()
	if n.imex == nil {
		return nil
	}
	return n.imex.daemon
}

// StopIMEX ends the node's IMEX supervision and its daemon, as the node's
// shutdown would: the real plugin leaves the daemon to its successor.
func (n *Node) StopIMEX() {
	n.pluginMu.Lock()
	run := n.imex
	n.imex = nil
	n.pluginMu.Unlock()
	if run == nil {
		return
	}
	run.cancel()
	<-run.done
	run.daemon.Supervisor().Stop(context.Background())
}
