package cdbench

import (
	"os"
	"testing"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

func TestMain(m *testing.M) {
	// Started as one of the nodes' fake daemons (cluster.Start installs
	// them).
	if code, ok := cluster.Main(); ok {
		os.Exit(code)
	}
	// A benchmark prints its figures only.
	clustertest.ParseFlags("FATAL")
	os.Exit(m.Run())
}
