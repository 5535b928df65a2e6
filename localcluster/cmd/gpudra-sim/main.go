// Command gpudra-sim runs gpudra on a local cluster: an in-process control
// plane (etcd, kube-apiserver, kube-scheduler, the controllers) and
// simulated GPU nodes, each with gpudra's kubelet plugin and the kubelet's
// own DRA code. Its commands are thin: "up" is package uprun, "load"
// package loadrun.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/loadrun"
	"github.com/gpudra/gpudra/localcluster/uprun"
)

func main() {
	// Started as nvidia-cuda-mps-control, nvidia-imex or nvidia-imex-ctl
	// (links to this program that cluster.Start installs): run as the
	// simulated nodes' daemon.
	if code, ok := cluster.Main(); ok {
		os.Exit(code)
	}
	inv, err := parse(os.Args[1:], os.Stderr)
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case err != nil:
		fmt.Fprintln(os.Stderr, "gpudra-sim:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := inv.run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gpudra-sim:", err)
		os.Exit(1)
	}
}

// run runs the command's run, its report on stdout and its progress on
// standard error.
func (inv *invocation) run(ctx context.Context, stdout io.Writer) error {
	closeLog, err := setUpLogging(inv.log)
	if err != nil {
		return err
	}
	defer closeLog()
	if inv.command == "load" {
		o := inv.load
		o.Out, o.Progress, o.AroundStop = stdout, progress, quietStderr
		_, err := loadrun.Run(ctx, o)
		return err
	}
	o := inv.up
	o.Stdout, o.Progress, o.AroundStop = stdout, progress, quietStderr
	_, err = uprun.Run(ctx, o)
	return err
}
