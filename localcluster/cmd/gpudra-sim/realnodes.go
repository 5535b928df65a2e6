package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/gpudra/gpudra/pkg/hardware/sim"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/realnode/containerruntime"
	"github.com/gpudra/gpudra/localcluster/realnode/node"
)

// prepareRealNodes checks that this machine can run the real nodes
// --real-nodes asks for and builds their programs (cached after the first
// run). Where the machine cannot, it says what is missing and returns nil:
// the cluster runs with simulated nodes only. A count the fleet cannot
// give is an error.
func prepareRealNodes(ctx context.Context, o options, fleet *sim.Fleet, progress func(string, ...any)) (*cluster.RealNodes, error) {
	switch {
	case o.realNodes == 0:
		return nil, nil
	case o.realNodes < 0:
		return nil, fmt.Errorf("--real-nodes %d: want 0 or more", o.realNodes)
	case o.realNodes > len(fleet.Nodes):
		return nil, fmt.Errorf("--real-nodes %d: fleet %s has %d nodes", o.realNodes, o.fleet, len(fleet.Nodes))
	}
	if err := realNodeMachine(); err != nil {
		progress("real nodes: none (%v); the cluster runs with simulated nodes only", err)
		return nil, nil
	}
	start := time.Now()
	b, err := node.BuildBinaries(ctx, node.WithProgress(func(msg string) { progress("real nodes: %s", msg) }))
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		progress("real nodes: none (%v); the cluster runs with simulated nodes only", err)
		return nil, nil
	}
	progress("%-24s ready in %v", "real node binaries", time.Since(start).Round(time.Millisecond))
	return &cluster.RealNodes{Count: o.realNodes, FleetName: o.fleet, Binaries: b}, nil
}

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
