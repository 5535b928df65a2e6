// Command gpudra-chaos runs gpudra's chaos trials (package chaos): `make
// chaos` runs it. Its last line reads "chaos: <N> trials, <M> invariant
// violations"; it exits 1 when M > 0.
package main

import (
	"os"

	"github.com/gpudra/gpudra/internal/chaos"
	"github.com/gpudra/gpudra/internal/mpsfake"
)

func main() {
	// The plugin starts MPS daemons through this program, as the fake
	// nvidia-cuda-mps-control.
	if code, ok := mpsfake.Main(); ok {
		os.Exit(code)
	}
	os.Exit(chaos.Main(os.Args[1:], os.Stdout, os.Stderr, "make chaos CHAOS_ARGS='-seed %d -trials 5'", nil))
}
