package draplugin_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/gpudra/gpudra/internal/mpsfake"
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
	dir, cleanup, err := mpsfake.SetUp()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fakeMPSBin = dir
	code := m.Run()
	cleanup()
	os.Exit(code)
}
