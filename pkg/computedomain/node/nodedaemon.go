package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/gpudra/gpudra/pkg/features/imexchannel"
	"github.com/gpudra/gpudra/pkg/imex"
)

// Daemon is the IMEX side of the node's channel plugin: the node's one
// supervised nvidia-imex and its reports in the domains' cliques. It
// implements [imexchannel.Daemon]: channel claims hold it.
type Daemon struct {
	supervisor *imex.Supervisor
	reporter   *Reporter
	hosts      imex.HostsFile

	mu     sync.Mutex
	claims map[string]string // claim UID -> domain UID
}

var _ imexchannel.Daemon = &Daemon{}

// DaemonConfig configures a [Daemon].
type DaemonConfig struct {
	// Supervisor is the daemon's options; OnReady is set by NewDaemon.
	Supervisor imex.Options
	// Reporter configures the node's reports; Peers is set by
	// NewDaemon.
	Reporter ReporterConfig
	// HostsFile is where the peers' names resolve.
	HostsFile string
}

// NewDaemon wires a supervisor and a reporter: readiness goes into the
// reports, the peers seen in the cliques go into the hosts file, and the
// daemon gets SIGUSR1 when they changed.
func NewDaemon(cfg DaemonConfig) (*Daemon, error) {
	n := &Daemon{hosts: imex.HostsFile{Path: cfg.HostsFile}, claims: map[string]string{}}
	rc := cfg.Reporter
	rc.Peers = n.writePeers
	n.reporter = NewReporter(rc)
	so := cfg.Supervisor
	so.OnReady = func(ready bool) {
		n.reporter.SetReady(ready)
		if ready {
			// A daemon that started while the hosts block changed may
			// have read the old one before it could be signalled.
			_ = n.supervisor.Signal(syscall.SIGUSR1)
		}
	}
	s, err := imex.New(so)
	if err != nil {
		return nil, err
	}
	n.supervisor = s
	return n, nil
}

// Supervisor returns the daemon's supervisor.
func (n *Daemon) Supervisor() *imex.Supervisor { return n.supervisor }

// Reporter returns the node's reporter.
func (n *Daemon) Reporter() *Reporter { return n.reporter }

// Run supervises the daemon and reports until ctx ends.
func (n *Daemon) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.reporter.Run(ctx)
	}()
	err := n.supervisor.Run(ctx)
	<-done
	return err
}

// writePeers rewrites the hosts block and has a running daemon resolve
// its peers again.
func (n *Daemon) writePeers(ctx context.Context, peers map[int]string) {
	logger := klog.FromContext(ctx)
	changed, err := n.hosts.Write(peers)
	if err != nil {
		logger.Error(err, "Writing the IMEX peers failed")
		return
	}
	if !changed {
		return
	}
	logger.Info("IMEX peers changed", "hostsFile", n.hosts.Path, "peers", len(peers))
	if err := n.supervisor.Signal(syscall.SIGUSR1); err != nil {
		logger.Error(err, "Telling the IMEX daemon of its peers failed")
	}
}

// Hold implements [imexchannel.Daemon].
func (n *Daemon) Hold(ctx context.Context, claimUID, domainUID, cliqueID string) error {
	if cliqueID == "" {
		return errors.New("the node's NVLink clique is unknown: it cannot join an IMEX domain")
	}
	n.mu.Lock()
	n.claims[claimUID] = domainUID
	n.mu.Unlock()
	n.supervisor.Hold(claimUID)
	if err := n.reporter.Join(ctx, domainUID, cliqueID); err != nil {
		return fmt.Errorf("join domain %s: %w", domainUID, err)
	}
	return nil
}

// Release implements [imexchannel.Daemon]: the node leaves a domain when
// its last claim of the domain is gone.
func (n *Daemon) Release(ctx context.Context, claimUID string) error {
	n.mu.Lock()
	domain, ok := n.claims[claimUID]
	delete(n.claims, claimUID)
	still := false
	for _, d := range n.claims {
		still = still || d == domain
	}
	n.mu.Unlock()
	n.supervisor.Release(claimUID)
	if !ok || still {
		return nil
	}
	return n.reporter.Leave(ctx, domain)
}

// WaitReady implements [imexchannel.Daemon].
func (n *Daemon) WaitReady(ctx context.Context) error { return n.supervisor.WaitReady(ctx) }
