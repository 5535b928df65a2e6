package simnode

import (
	"context"
	"path/filepath"

	"github.com/gpudra/gpudra/localcluster/simnic"
)

// startNICDriver starts the simulated NIC driver on a node with NICs, as a
// network DRA driver's DaemonSet would run beside gpudra's: its own data
// directory, the node's registration and CDI directories, the kubelet's
// client. It returns once the DRA manager has it registered and its NICs
// are published.
func (n *Node) startNICDriver(ctx context.Context) error {
	if len(n.cfg.NICs) == 0 {
		return nil
	}
	d, err := simnic.Start(n.ctx, simnic.Config{
		NodeName:      n.cfg.Name,
		NICs:          n.cfg.NICs,
		KubeClient:    n.cfg.KubeletClient,
		PluginDataDir: filepath.Join(n.cfg.Dir, "plugins", simnic.DefaultDriverName),
		RegistrarDir:  n.cfg.registryDir(),
		CDIDir:        n.cfg.CDIDir(),
	})
	if err != nil {
		return err
	}
	n.nics = d
	return n.waitForDriver(ctx, d.DriverName(), func() int { return len(d.Devices()) })
}
