// Command gpudra is the gpudra DRA driver for NVIDIA GPUs: one binary whose
// subcommands are the driver's components.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/gpudra/gpudra/pkg/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCommand().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "Error:", err)
		os.Exit(1)
	}
}

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "gpudra",
		Short:         "Kubernetes DRA driver for NVIDIA GPUs",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newKubeletPluginCommand(), newComputeDomainKubeletPluginCommand(), newComputeDomainControllerCommand(), newDevicePluginCommand(), newWebhookCommand(), newInspectCommand(), newExplainCommand(), newFleetViewCommand(), newVersionCommand())
	return root
}

func newVersionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the gpudra version, git commit, Go version and platform",
		Long: `Print the release version and git commit stamped in at build time (make
build, make image and the Dockerfile stamp them), else those the Go
toolchain recorded, with the Go version and platform.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return writeVersion(cmd.OutOrStdout(), output, version.Get())
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}

func writeVersion(w io.Writer, output string, info version.Info) error {
	switch output {
	case "text":
		_, err := fmt.Fprintf(w, "gpudra %s\ncommit %s\ngo %s\nplatform %s\n", info.Version, info.Commit, info.GoVersion, info.Platform)
		return err
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(info)
	default:
		return fmt.Errorf("--output %q: want text or json", output)
	}
}
