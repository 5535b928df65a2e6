package mps_test

import (
	"os"
	"testing"

	"github.com/gpudra/gpudra/internal/mpsfake"
)

// fakeBin is the directory with the fake programs (symlinks to the test
// binary, which runs them through mpsfake.Main).
var fakeBin string

func TestMain(m *testing.M) { os.Exit(mpsfake.RunTests(m, &fakeBin)) }
