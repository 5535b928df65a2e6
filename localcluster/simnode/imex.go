package simnode

import (
	"context"
	"path/filepath"
	"sync"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpudra/gpudra/internal/imexfake"
	cdnode "github.com/gpudra/gpudra/pkg/computedomain/node"
	"github.com/gpudra/gpudra/pkg/features/imexchannel"
	"github.com/gpudra/gpudra/pkg/pluginflags"
)

// imexRun is a node's running IMEX side.
type imexRun struct {
	daemon *cdnode.Daemon
	cancel context.CancelFunc
	done   chan struct{}
}

// imexState is what the node knows of its channel plugin's IMEX side.
type imexState struct {
	mu  sync.Mutex
	run *imexRun
	// dir is the daemon's directory as the plugin's flags set it.
	dir string
}

// IMEXDir is where the node's IMEX daemon keeps its config, peer list and
// log: --imex-dir of the channel plugin last started, by default
// <plugin-data-dir>/imex.
func (n *Node) IMEXDir() string {
	n.imex.mu.Lock()
	defer n.imex.mu.Unlock()
	return n.imex.dir
}

// IMEXHostsFile is the node's hosts file, whose marked block maps its
// peers' names (the chart's hosts-file volume); the fake daemon resolves
// them through it.
func (n *Node) IMEXHostsFile() string { return filepath.Join(n.cfg.Dir, "hosts") }

// startIMEX builds and runs the node's IMEX side as the plugin's IMEX
// flags say; nil (channels only) when they leave it off or its binary is
// missing with --imex-daemon=auto.
func (n *Node) startIMEX(ctx context.Context, kube kubernetes.Interface, dyn dynamic.Interface, flags *pluginflags.ComputeDomainPlugin) (imexchannel.Daemon, error) {
	// The fake resolves names through the node's hosts file; the real
	// daemon would use the node's resolver.
	flags.IMEX.DaemonEnv = append(flags.IMEX.DaemonEnv, imexfake.EnvHostsFile+"="+flags.IMEX.HostsFile)
	d, err := flags.IMEX.NodeDaemon(ctx, kube, dyn, flags.NodeName, flags.PluginDataDir)
	if err != nil || d == nil {
		return nil, err
	}
	dir := flags.IMEX.Dir
	if dir == "" {
		dir = filepath.Join(flags.PluginDataDir, "imex")
	}
	runCtx, cancel := context.WithCancel(n.ctx)
	run := &imexRun{daemon: d, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(run.done)
		if err := d.Run(runCtx); err != nil {
			n.logger.Error(err, "IMEX daemon supervision ended")
		}
	}()
	n.imex.mu.Lock()
	n.imex.run, n.imex.dir = run, dir
	n.imex.mu.Unlock()
	return d, nil
}

// IMEX returns the node's IMEX side, nil when its channel plugin runs
// without one.
func (n *Node) IMEX() *cdnode.Daemon {
	n.imex.mu.Lock()
	defer n.imex.mu.Unlock()
	if n.imex.run == nil {
		return nil
	}
	return n.imex.run.daemon
}

// StopIMEX ends the node's IMEX supervision and its daemon, as the node's
// shutdown would: the real plugin leaves the daemon to its successor.
func (n *Node) StopIMEX() {
	n.imex.mu.Lock()
	run := n.imex.run
	n.imex.run = nil
	n.imex.mu.Unlock()
	if run == nil {
		return
	}
	run.cancel()
	<-run.done
	run.daemon.Supervisor().Stop(context.Background())
}
