package simnode

import (
	"context"
	"fmt"
	"path/filepath"

	"k8s.io/client-go/kubernetes"

	"github.com/gpudra/gpudra/pkg/features"
	"github.com/gpudra/gpudra/pkg/features/imexchannel"
	"github.com/gpudra/gpudra/pkg/plugin"
)

// ComputeDomainDriverName is the channel driver's name.
const ComputeDomainDriverName = "compute-domain.nvidia.com"

// StartComputeDomainPlugin starts the ComputeDomain channel plugin on the
// node, beside its GPU plugin, as the DaemonSet's second container would:
// its own data directory, the node's registration and CDI directories,
// and the same simulated hardware. It returns once the node's DRA manager
// has it registered and its devices are published; the caller stops it
// before the node.
func (n *Node) StartComputeDomainPlugin(ctx context.Context, client kubernetes.Interface, channels imexchannel.Channels) (*plugin.Driver, error) {
	d, err := plugin.Start(n.ctx, plugin.Config{
		DriverName:    ComputeDomainDriverName,
		NodeName:      n.cfg.Name,
		KubeClient:    client,
		Hardware:      n.cfg.Hardware,
		PluginDataDir: filepath.Join(n.cfg.Dir, "plugins", ComputeDomainDriverName),
		RegistrarDir:  n.cfg.registryDir(),
		CDIDir:        n.cfg.CDIDir(),
		Features: func(plugin.FeatureEnv) (*features.Set, error) {
			return features.NewComputeDomain(features.ComputeDomainOptions{Channels: channels, SharedChannel: true}), nil
		},
	})
	if err != nil {
		return nil, fmt.Errorf("node %s: start ComputeDomain plugin: %w", n.cfg.Name, err)
	}
	if err := n.waitForDriver(ctx, ComputeDomainDriverName, len(d.Devices())); err != nil {
		d.Stop()
		return nil, err
	}
	return d, nil
}
