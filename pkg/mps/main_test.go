package mps_test

import (
	"fmt"
	"os"
	"strings"
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
	dir, err := os.MkdirTemp("", "mpsfake")
	if err == nil {
		err = mpsfake.Install(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fakeBin = dir
	// Under the race detector every process sleeps a second before it
	// exits; the fakes are many short processes.
	if !strings.Contains(os.Getenv("GORACE"), "atexit_sleep_ms") {
		_ = os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
