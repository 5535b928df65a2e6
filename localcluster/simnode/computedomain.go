package simnode

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
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
// before the node. With imexCfg, the plugin supervises the node's IMEX
// daemon and reports it in the domains' cliques, as with the IMEX flags on
// a real node; nil serves channels only.
func (n *Node) StartComputeDomainPlugin(ctx context.Context, client kubernetes.Interface, channels imexchannel.Channels, imexCfg *IMEXConfig) (*plugin.Driver, error) {
	var daemon imexchannel.Daemon
	if imexCfg != nil {
		d, err := n.startIMEX(client, imexCfg)
		if err != nil {
			return nil, fmt.Errorf("node %s: IMEX daemon: %w", n.cfg.Name, err)
		}
		daemon = d
	}
	d, err := plugin.Start(n.ctx, plugin.Config{
		DriverName:    ComputeDomainDriverName,
		NodeName:      n.cfg.Name,
		KubeClient:    client,
		Hardware:      n.cfg.Hardware,
		PluginDataDir: filepath.Join(n.cfg.Dir, "plugins", ComputeDomainDriverName),
		RegistrarDir:  n.cfg.registryDir(),
		CDIDir:        n.cfg.CDIDir(),
		Features: func(plugin.FeatureEnv) (*features.Set, error) {
			return features.NewComputeDomain(features.ComputeDomainOptions{Channels: channels, SharedChannel: true, Daemon: daemon}), nil
		},
	})
	if err != nil {
		n.StopIMEX()
		return nil, fmt.Errorf("node %s: start ComputeDomain plugin: %w", n.cfg.Name, err)
	}
	want := len(d.Devices())
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if n.plugins != nil {
			if _, err := n.plugins.GetPlugin(ComputeDomainDriverName); err != nil {
				return false, nil
			}
		}
		slices, err := n.cfg.KubeletClient.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.cfg.Name})
		if err != nil {
			return false, nil
		}
		got := 0
		for _, s := range slices.Items {
			if s.Spec.Driver == ComputeDomainDriverName {
				got += len(s.Spec.Devices)
			}
		}
		return got == want, nil
	})
	if err != nil {
		d.Stop()
		n.StopIMEX()
		return nil, fmt.Errorf("node %s: ComputeDomain plugin not registered with its %d devices published: %w", n.cfg.Name, want, err)
	}
	return d, nil
}
