package loadrun

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/gpudra/gpudra/localcluster/cluster"
)

// TestMixedLoadRound runs one small mixed round of each driver on two
// nodes of the mixed fleet, as the load run does: every pod runs with a
// device of its kind (verifyLoad), gpudra's MIG pods on MIG devices its
// plugin created on the GPU and its share pods on shares its checkpoint
// holds; the baseline serves the same claims. Deleting gpudra's pods
// destroys the MIG devices again.
func TestMixedLoadRound(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const nodes, pods = 2, 20
	if err := MixMixed.fits(pods, nodes); err != nil {
		t.Fatal(err)
	}
	fleet, err := MixMixed.fleet(nodes, "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.Start(ctx, cluster.Options{Fleet: fleet, Baseline: DefaultBaselineDriver, NoDaemons: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	}()
	client, err := kubernetes.NewForConfig(c.ControlPlane().RESTConfig("gpudra-sim-load", creatorQPS, creatorBurst))
	if err != nil {
		t.Fatal(err)
	}
	runs := loadRuns(c.Options().DriverName, DefaultBaselineDriver)
	if err := createLoadClasses(ctx, client, runs); err != nil {
		t.Fatal(err)
	}
	lr := &runner{o: Options{Progress: func(msg string) { t.Log(msg) }}, mix: MixMixed}
	kinds := MixMixed.kinds(pods)
	wantMIG := count(kinds, kindMIG)
	if wantMIG == 0 || count(kinds, kindShare) == 0 {
		t.Fatalf("kinds %v: want MIG and share pods", kinds)
	}
	migDevices := func() int {
		t.Helper()
		n := 0
		for _, node := range c.SimNodes() {
			inv, err := node.Hardware().Discover(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range inv.GPUs {
				n += len(g.MIGDevices)
			}
		}
		return n
	}
	for _, run := range []*driverRun{runs[1], runs[0]} {
		start := time.Now()
		prefix := run.name + "0"
		if _, err := lr.loadRound(ctx, c, client, prefix, kinds, run.templates, 2*time.Minute); err != nil {
			t.Fatalf("%s round: %v", run.name, err)
		}
		if err := verifyLoad(ctx, c, client, prefix, pods, run.driver); err != nil {
			t.Errorf("%s round: %v", run.name, err)
		}
		// gpudra created one MIG device per MIG pod; the baseline none.
		want := wantMIG
		if run.driver == DefaultBaselineDriver {
			want = 0
		}
		if got := migDevices(); got != want {
			t.Errorf("%s round: %d MIG devices exist, want %d", run.name, got, want)
		}
		// The other driver's check fails on this round: the check sees
		// whose device a pod got.
		other := runs[0].driver
		if run.driver == other {
			other = runs[1].driver
		}
		if err := verifyLoad(ctx, c, client, prefix, pods, other); err == nil {
			t.Errorf("%s round passed the check of driver %s", run.name, other)
		}
		if err := deleteAllPods(ctx, client, 2*time.Minute); err != nil {
			t.Fatalf("%s round: delete the pods: %v", run.name, err)
		}
		if got := migDevices(); got != 0 {
			t.Errorf("after the %s round's pods were deleted, %d MIG devices exist", run.name, got)
		}
		t.Logf("%s round of %d pods (%s) checked and deleted in %v", run.name, pods, MixMixed.describe(pods), time.Since(start).Round(time.Millisecond))
	}
}
