// Package nodecmd holds the subcommands of the roles that run on every
// GPU node (kubelet-plugin, compute-domain-kubelet-plugin, device-plugin,
// and inspect, the kubelet plugin's init container) and version, for the
// two programs that serve them: gpudra, which has every subcommand, and
// gpudra-node, which has only these, so that a DaemonSet's process links
// and initialises none of the webhook's, explain's, fleet-view's or the
// ComputeDomain controller's dependencies (docs/design/performance.md,
// The kubelet plugin's memory and start).
package nodecmd

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// Commands returns new instances of the node's subcommands, for a root
// command to add.
func Commands() []*cobra.Command {
	return []*cobra.Command{
		NewKubeletPluginCommand(),
		NewComputeDomainKubeletPluginCommand(),
		NewDevicePluginCommand(),
		NewInspectCommand(),
		NewVersionCommand(),
	}
}

// Main runs root with the process's arguments until SIGINT or SIGTERM
// cancels its context, and exits 1 with the error on stderr when it
// fails.
func Main(root *cobra.Command) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		stop()
		os.Exit(1)
	}
}
