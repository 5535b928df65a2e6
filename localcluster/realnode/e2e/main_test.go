package e2e

import (
	"os"
	"testing"

	"github.com/gpudra/gpudra/localcluster/cluster"
)

func TestMain(m *testing.M) {
	// Started as one of the simulated nodes' fake daemons (cluster.Start
	// installs them; the real node runs its own, realnode/fakemps).
	if code, ok := cluster.Main(); ok {
		os.Exit(code)
	}
	os.Exit(m.Run())
}
