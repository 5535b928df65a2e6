package loadrun

import (
	"context"
	"runtime/pprof"
	"testing"

	"github.com/gpudra/gpudra/localcluster/simnode"
)

// Goroutines started under a driver's label are counted as that driver's,
// the others under "".
func TestGoroutinesByDriver(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	started := make(chan struct{})
	const n = 3
	pprof.Do(context.Background(), pprof.Labels(simnode.DriverLabel, "test.driver"), func(context.Context) {
		for range n {
			go func() { started <- struct{}{}; <-stop }()
		}
	})
	for range n {
		<-started
	}
	got, err := goroutinesByDriver()
	if err != nil {
		t.Fatal(err)
	}
	if got["test.driver"] != n || got[""] < 1 {
		t.Errorf("goroutines by driver %v, want %d of test.driver and this one among the rest", got, n)
	}
}

func TestProcStatusKB(t *testing.T) {
	if kb, err := procStatusKB("VmRSS:"); err != nil || kb == 0 {
		t.Errorf("VmRSS: %d kB, %v; want a size", kb, err)
	}
	if _, err := procStatusKB("NoSuchField:"); err == nil {
		t.Error("a missing field gave no error")
	}
}
