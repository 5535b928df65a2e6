package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/gpudra/gpudra/localcluster/realnode/containerruntime"
	"github.com/gpudra/gpudra/localcluster/realnode/node"
)

// buildBinaries checks that this machine can run real nodes and builds
// their programs, where the options give none.
func (r *RealNodes) buildBinaries(ctx context.Context, progress func(string)) error {
	if r.Binaries != (node.Binaries{}) {
		return nil
	}
	if err := checkRealNodeMachine(); err != nil {
		return err
	}
	start := time.Now()
	b, err := node.BuildBinaries(ctx, node.WithProgress(func(msg string) { progress("real nodes: " + msg) }))
	if err != nil {
		return err
	}
	progress(fmt.Sprintf("%-24s ready in %v", "real node binaries", time.Since(start).Round(time.Millisecond)))
	r.Binaries = b
	return nil
}

// checkRealNodeMachine is realNodeMachine; tests replace it with a machine
// that lacks something.
var checkRealNodeMachine = realNodeMachine

// realNodeMachine says what this machine lacks for a real node: what
// containerruntime.CheckMachine checks (root, overlay, cgroup
// controllers), runc, and the static busybox of the test image.
func realNodeMachine() error {
	var errs []error
	dir, err := os.MkdirTemp("", "gpudra-sim-check-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := containerruntime.CheckMachine(dir); err != nil {
		errs = append(errs, err)
	}
	if _, err := exec.LookPath("runc"); err != nil {
		errs = append(errs, errors.New("no runc on PATH (Debian: apt-get install runc)"))
	}
	if _, err := os.Stat(containerruntime.BusyboxPath); err != nil {
		errs = append(errs, fmt.Errorf("no static busybox at %s (Debian: apt-get install busybox-static)", containerruntime.BusyboxPath))
	}
	return errors.Join(errs...)
}

// RealNodesDropped says why the cluster runs without the real nodes its
// options asked for ([RealNodes.FallBack]); empty when it runs with them,
// or none were asked for.
func (c *Cluster) RealNodesDropped() string { return c.realNodesDropped }
