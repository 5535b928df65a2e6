package main

import (
	"context"

	"github.com/gpudra/gpudra/localcluster/loadrun"
)

// runLoad is --load: the load run of package loadrun, as the flags say,
// its report on standard output.
func runLoad(ctx context.Context, o options) error {
	_, err := loadrun.Run(ctx, loadrun.Options{
		Pods:               o.load,
		Nodes:              o.loadNodes,
		Mix:                o.loadMix,
		Rounds:             o.loadRounds,
		RoundTimeout:       o.loadRoundTimeout,
		BaselineDriver:     o.loadBaseline,
		Dir:                o.loadDir,
		CPUProfile:         o.cpuProfile,
		CPUProfileBaseline: o.cpuProfileBaseline,
		CPUProfileIdle:     o.cpuProfileIdle,
		Progress:           func(msg string) { progress("%s", msg) },
		AroundStop:         quietStderr,
	})
	return err
}
