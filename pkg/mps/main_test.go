package mps_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/gpudra/gpudra/pkg/mps/mpsfake"
)

// fakeBin is the directory with the fake programs (symlinks to the test
// binary, which runs them through mpsfake.Main).
var fakeBin string

func TestMain(m *testing.M) {
	if code, ok := mpsfake.Main(); ok {
		os.Exit(code)
	}
	dir, cleanup, err := mpsfake.SetUp()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fakeBin = dir
	code := m.Run()
	cleanup()
	os.Exit(code)
}
