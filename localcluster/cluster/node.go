package cluster

import (
	"context"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpudra/gpudra/pkg/checkpoint"
	"github.com/gpudra/gpudra/pkg/claimstate"

	"github.com/gpudra/gpudra/localcluster/realnode/node"
	"github.com/gpudra/gpudra/localcluster/simnode"
)

// Node is one node of the cluster, simulated or real: what a test or a
// tool does with a node whatever runs it. [Cluster.SimNode] and
// [Cluster.RealNode] give what only one kind has.
type Node interface {
	// Name is the node's name, also the name of gpudra's pool on it.
	Name() string
	// Real says whether the node runs the real kubelet, containerd and
	// gpudra's container, rather than in-process simulations.
	Real() bool
	// PluginDataDir is the data directory of gpudra's kubelet plugin on
	// the node: its sockets and its checkpoint.
	PluginDataDir() string
	// CDIDir is where the plugin writes the claims' CDI specs.
	CDIDir() string
	// Checkpoint reads the plugin's prepared claims from its checkpoint.
	Checkpoint() (*claimstate.State, error)
	// ContainerLog is what `kubectl logs` shows for a container of pod on
	// the node: what a real container printed, or what a simulated one
	// was given.
	ContainerLog(pod *corev1.Pod, container string) (string, error)
	// RestartPlugin restarts gpudra's kubelet plugin on the node, as a
	// crash would, and returns once it serves again.
	RestartPlugin(ctx context.Context) error
}

// Nodes returns every node: the real ones first, then the simulated ones
// in fleet order.
func (c *Cluster) Nodes() []Node {
	out := make([]Node, 0, len(c.real)+len(c.nodes))
	for _, n := range c.real {
		out = append(out, realNode{n, c})
	}
	for _, n := range c.nodes {
		out = append(out, simNode{n})
	}
	return out
}

// Node returns the node called name, simulated or real, or nil.
func (c *Cluster) Node(name string) Node {
	if n := c.RealNode(name); n != nil {
		return realNode{n, c}
	}
	if n := c.SimNode(name); n != nil {
		return simNode{n}
	}
	return nil
}

// simNode is a simulated node as a [Node].
type simNode struct{ *simnode.Node }

func (simNode) Real() bool { return false }

// realNode is a real node as a [Node]: what it does through the API server
// or the plugin's files needs the cluster.
type realNode struct {
	*node.Node
	c *Cluster
}

func (realNode) Real() bool { return true }

func (n realNode) PluginDataDir() string {
	return filepath.Join(n.Layout().PluginsDir(), n.c.opts.DriverName)
}

func (n realNode) CDIDir() string { return n.Layout().CDIDir() }

func (n realNode) Checkpoint() (*claimstate.State, error) {
	return simnode.PeekCheckpoint(n.PluginDataDir(), checkpoint.WithPool(n.Name()), checkpoint.WithDriverName(n.c.opts.DriverName))
}

func (n realNode) RestartPlugin(ctx context.Context) error {
	return n.Node.RestartPlugin(ctx, n.c.Client(), n.c.Release().Namespace)
}
