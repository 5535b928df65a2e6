package nodecmd

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/gpudra/gpudra/pkg/version"
)

// NewVersionCommand prints the version gpudra was built as.
func NewVersionCommand() *cobra.Command {
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
