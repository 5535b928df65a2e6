package deviceplugin_test

import (
	"os"
	"testing"

	"github.com/gpudra/gpudra/internal/mpsfake"
)

// fakeMPSBin holds a fake nvidia-cuda-mps-control (this test binary, run
// through a symlink) for the MPS replica tests.
var fakeMPSBin string

func TestMain(m *testing.M) { os.Exit(mpsfake.RunTests(m, &fakeMPSBin)) }
