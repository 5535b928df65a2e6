// Command gpudra-node is gpudra's subcommands of the node's roles alone:
// kubelet-plugin, compute-domain-kubelet-plugin, device-plugin, inspect
// and version, as gpudra has them. The chart's DaemonSets run it: a process
// on every GPU node that links none of the webhook's, explain's, fleet-view's
// or the ComputeDomain controller's dependencies maps and initialises less
// (docs/design/performance.md, The kubelet plugin's memory and start).
package main

import (
	"github.com/spf13/cobra"

	"github.com/gpudra/gpudra/internal/nodecmd"
)

func main() { nodecmd.Main(newRootCommand()) }

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "gpudra-node",
		Short:         "gpudra's node roles: the DRA kubelet plugins, the device plugin, inspect",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(nodecmd.Commands()...)
	return root
}
