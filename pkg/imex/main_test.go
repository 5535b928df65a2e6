package imex_test

import (
	"os"
	"testing"

	"github.com/gpudra/gpudra/internal/imexfake"
)

// fakeBin holds the fake nvidia-imex and nvidia-imex-ctl (symlinks to the
// test binary, which runs them through imexfake.Main).
var fakeBin string

func TestMain(m *testing.M) { os.Exit(imexfake.RunTests(m, &fakeBin)) }
