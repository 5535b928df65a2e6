package simnode

import (
	"context"
	"fmt"
	"path/filepath"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/gpudra/gpudra/pkg/draplugin"
	"github.com/gpudra/gpudra/pkg/pluginflags"
)

// StartComputeDomainPlugin starts the ComputeDomain channel plugin on the
// node, beside its GPU plugin, as the DaemonSet's compute-domains
// container: args is that container's command line (`gpudra
// compute-domain-kubelet-plugin` and its flags, host paths already mapped
// to the node's directories), parsed with the binary's own flag set, and
// restConfig is its ServiceAccount's identity. Its data directory must be
// the node's plugins/<driver>, its registration and CDI directories the
// node's, its IMEX hosts file the node's [Node.IMEXHostsFile]; its
// hardware is the node's simulated GPUs. With the IMEX flags on and their
// binary found, the plugin supervises the node's IMEX daemon and reports it
// in the domains' cliques, as on a real node. It returns once the
// node's DRA manager has it registered and its devices are published; the
// caller stops it before the node.
func (n *Node) StartComputeDomainPlugin(ctx context.Context, args []string, restConfig *rest.Config) (*draplugin.Driver, error) {
	if len(args) == 0 || args[0] != "compute-domain-kubelet-plugin" {
		return nil, fmt.Errorf("node %s: command line %q: want gpudra compute-domain-kubelet-plugin", n.cfg.Name, args)
	}
	flags, err := pluginflags.ParseComputeDomainPlugin(args[1:])
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", n.cfg.Name, err)
	}
	for _, f := range []struct{ flag, got, want string }{
		{"--node-name", flags.NodeName, n.cfg.Name},
		{"--plugin-data-dir", flags.PluginDataDir, filepath.Join(n.cfg.Dir, "plugins", flags.DriverName)},
		{"--registrar-dir", flags.RegistrarDir, n.cfg.registryDir()},
		{"--cdi-dir", flags.CDIDir, n.cfg.CDIDir()},
		{"--imex-hosts-file", flags.IMEX.HostsFile, n.IMEXHostsFile()},
	} {
		if f.got != f.want {
			return nil, fmt.Errorf("node %s: compute-domain-kubelet-plugin %s %q: the simulated node's is %q", n.cfg.Name, f.flag, f.got, f.want)
		}
	}
	rc := rest.CopyConfig(restConfig)
	rc.QPS, rc.Burst = flags.KubeAPIQPS, flags.KubeAPIBurst
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	if err := flags.Validate(); err != nil {
		return nil, fmt.Errorf("node %s: compute-domain-kubelet-plugin: %w", n.cfg.Name, err)
	}
	daemon, err := n.startIMEX(ctx, kube, dyn, flags)
	if err != nil {
		return nil, fmt.Errorf("node %s: compute-domain-kubelet-plugin: IMEX daemon: %w", n.cfg.Name, err)
	}
	cfg, err := flags.Config(kube, dyn, n.cfg.Hardware, daemon)
	if err != nil {
		n.StopIMEX()
		return nil, fmt.Errorf("node %s: compute-domain-kubelet-plugin: %w", n.cfg.Name, err)
	}
	d, err := draplugin.Start(n.ctx, cfg)
	if err != nil {
		n.StopIMEX()
		return nil, fmt.Errorf("node %s: start ComputeDomain plugin: %w", n.cfg.Name, err)
	}
	if err := n.waitForDriver(ctx, flags.DriverName, func() int { return len(d.Devices()) }); err != nil {
		d.Stop()
		n.StopIMEX()
		return nil, err
	}
	return d, nil
}
