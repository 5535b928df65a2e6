// Command gpudra is the gpudra DRA driver for NVIDIA GPUs: one binary whose
// subcommands are the driver's components. The node's roles are also in
// gpudra-node (cmd/gpudra-node), which the chart's DaemonSets run.
package main

import (
	"github.com/spf13/cobra"

	"github.com/gpudra/gpudra/internal/nodecmd"
)

func main() { nodecmd.Main(newRootCommand()) }

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "gpudra",
		Short:         "Kubernetes DRA driver for NVIDIA GPUs",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(nodecmd.Commands()...)
	root.AddCommand(newComputeDomainControllerCommand(), newWebhookCommand(), newExplainCommand(), newFleetViewCommand())
	return root
}
