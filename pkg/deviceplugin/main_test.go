package deviceplugin_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/gpudra/gpudra/pkg/mps/mpsfake"
)

// fakeMPSBin holds a fake nvidia-cuda-mps-control (this test binary, run
// through a symlink) for the MPS replica tests.
var fakeMPSBin string

func TestMain(m *testing.M) {
	if code, ok := mpsfake.Main(); ok {
		os.Exit(code)
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
