package node

import (
	"os"
	"testing"

	"github.com/gpudra/gpudra/internal/imexfake"
)

// fakeIMEXBin holds the fake nvidia-imex and nvidia-imex-ctl.
var fakeIMEXBin string

func TestMain(m *testing.M) { os.Exit(imexfake.RunTests(m, &fakeIMEXBin)) }
