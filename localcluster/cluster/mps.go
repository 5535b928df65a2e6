package cluster

import (
	"os"
	"path/filepath"

	"github.com/gpudra/gpudra/pkg/mps/mpsfake"
)

// FakeMPS makes the running program the nvidia-cuda-mps-control of the
// simulated nodes: it installs symlinks to the program's executable in a
// new temporary directory and returns the control binary's path, for
// Options.MPSControlBinary, and a function that kills every fake process
// still running from the directory and removes it. The program must call
// mpsfake.Main first thing in main (or TestMain), so that it runs as the
// fake when started through a symlink.
func FakeMPS() (controlBinary string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "gpudra-mpsbin-")
	if err != nil {
		return "", nil, err
	}
	if err := mpsfake.Install(dir); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	return filepath.Join(dir, mpsfake.ControlName), func() {
		// Like real daemons, the fakes outlive their directories: those the
		// nodes did not stop end here.
		_ = mpsfake.Kill(mpsfake.Procs(dir))
		_ = os.RemoveAll(dir)
	}, nil
}
