package plugin_test

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/mps/mpsfake"
)

// fakeMPSBin holds a fake nvidia-cuda-mps-control (this test binary, run
// through a symlink) for the MPS tests.
var fakeMPSBin string

func TestMain(m *testing.M) {
	if code, ok := mpsfake.Main(); ok {
		os.Exit(code)
	}
	if os.Getenv(crashDirEnv) != "" {
		// A crash test's child plugin process, killed midway: it needs no
		// fakes, and could not remove them.
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "gpudra-mpsfake")
	if err == nil {
		err = mpsfake.Install(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fakeMPSBin = dir
	// The fakes are short processes; under the race detector each would
	// sleep a second at exit.
	if !strings.Contains(os.Getenv("GORACE"), "atexit_sleep_ms") {
		_ = os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
