// Command fakemps is the simulated nvidia-cuda-mps-control (and
// nvidia-cuda-mps-server) of a real node's simulated GPUs (package
// internal/mpsfake): a static program, copied under both names into the
// node's driver root, where gpudra's container finds it as
// usr/bin/nvidia-cuda-mps-control under its --container-driver-root.
package main

import (
	"fmt"
	"os"

	"github.com/gpudra/gpudra/internal/mpsfake"
)

func main() {
	if code, ok := mpsfake.Main(); ok {
		os.Exit(code)
	}
	fmt.Fprintf(os.Stderr, "%s: run it as %s or %s\n", os.Args[0], mpsfake.ControlName, mpsfake.ServerName)
	os.Exit(2)
}
