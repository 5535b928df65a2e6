package cluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/gpudra/gpudra/internal/fakeprog"
	"github.com/gpudra/gpudra/internal/imexfake"
	"github.com/gpudra/gpudra/internal/mpsfake"
	"github.com/gpudra/gpudra/pkg/imex"
)

// canRunFakes is set by Main: the running program dispatches to the fake
// daemons when started through one of their links.
var canRunFakes atomic.Bool

// Main runs the fake daemon the program was started as (through a link
// [Start] installed: nvidia-cuda-mps-control and its server, nvidia-imex,
// nvidia-imex-ctl) and returns its exit code with ok true; otherwise ok is
// false and the program goes on as itself. The nodes of a cluster run
// these fakes as the running program, so a program or test binary that
// starts a cluster with the default daemons must call Main first thing in
// main or TestMain:
//
//	if code, ok := cluster.Main(); ok {
//		os.Exit(code)
//	}
func Main() (code int, ok bool) {
	canRunFakes.Store(true)
	if code, ok := mpsfake.Main(); ok {
		return code, true
	}
	return imexfake.Main()
}

// errNoMain is Start's error when it would install fake daemons in a
// program that did not call Main: started through their links, such a
// program would run as itself (a test binary would run its tests again).
var errNoMain = errors.New("local cluster: the nodes' fake MPS and IMEX daemons run as this program, which must call cluster.Main first in main or TestMain (or set Options.NoDaemons)")

// setUpDaemons installs the fake daemons where the options leave them to
// Start: the MPS control binary always, the IMEX daemon when the chart's
// ComputeDomain driver runs. Stop removes them.
func (c *Cluster) setUpDaemons() error {
	if c.opts.NoDaemons {
		return nil
	}
	needMPS := c.opts.MPSControlBinary == ""
	needIMEX := c.opts.IMEXBinary == "" && c.computeDomainsEnabled()
	if !needMPS && !needIMEX {
		return nil
	}
	if !canRunFakes.Load() {
		return errNoMain
	}
	unboundFakes()
	if needMPS {
		bin, remove, err := FakeMPS()
		if err != nil {
			return fmt.Errorf("simulated MPS control binary: %w", err)
		}
		c.opts.MPSControlBinary = bin
		c.removeFakes = append(c.removeFakes, remove)
	}
	if needIMEX {
		bin, remove, err := FakeIMEX()
		if err != nil {
			return fmt.Errorf("simulated IMEX daemon: %w", err)
		}
		c.opts.IMEXBinary = bin
		c.removeFakes = append(c.removeFakes, remove)
	}
	return nil
}

// unboundFakes lets the fake daemons live as long as their claims, as
// real daemons do: the nodes stop them when their claims are unprepared,
// and Stop kills those left. Without it a fake ends after its default
// bound, a guard for test binaries killed before their cleanup, which a
// cluster that runs for hours would cross. A bound the environment
// already sets stays.
func unboundFakes() {
	for _, env := range []string{mpsfake.EnvMaxLifetime, imexfake.EnvMaxLifetime} {
		if _, set := os.LookupEnv(env); !set {
			_ = os.Setenv(env, "0")
		}
	}
}

// removeDaemons removes the fake daemons Start installed, killing those
// still running: like real daemons, the fakes outlive the plugins that
// started them.
func (c *Cluster) removeDaemons() {
	for _, remove := range c.removeFakes {
		remove()
	}
	c.removeFakes = nil
}

// FakeMPS makes the running program an nvidia-cuda-mps-control: it
// installs symlinks to the program's executable in a new temporary
// directory and returns the control binary's path, for
// Options.MPSControlBinary, and a function that kills every fake process
// still running from the directory and removes it. Start does this itself
// unless the options name a binary; a test that must see the daemons left
// after the cluster stopped installs its own. The program must call [Main]
// (or mpsfake.Main) first thing in main or TestMain.
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

// FakeIMEX makes the running program the nvidia-imex and nvidia-imex-ctl
// of the simulated nodes, as [FakeMPS] does for MPS. It returns the
// daemon's path, for Options.IMEXBinary, and a function that kills every
// fake daemon still running from the directory and removes it. The
// program must call [Main] (or imexfake.Main) first thing in main or
// TestMain.
func FakeIMEX() (binary string, remove func(), err error) {
	dir, err := os.MkdirTemp("", "gpudra-imexbin-")
	if err != nil {
		return "", nil, err
	}
	if err := imexfake.Install(dir); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	return filepath.Join(dir, imex.DaemonName), func() {
		_ = fakeprog.Kill(fakeprog.Procs(dir))
		_ = os.RemoveAll(dir)
	}, nil
}
