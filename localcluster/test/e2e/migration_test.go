package e2e

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpudra/gpudra/pkg/hardware"

	"github.com/gpudra/gpudra/localcluster/cluster"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
)

// migratedFleet is a node moved from NVIDIA's device plugin: its H100 is
// in MIG mode with an operator's layout, and the node runs the chart's
// default MIG mode (dynamic).
const migratedFleet = `
nodes:
- name: migrated-0
  gpus:
  - model: H100-SXM5-80GB
    migEnabled: true
    migDevices:
    - {profile: 1g.10gb, placementStart: 0}
    - {profile: 3g.40gb, placementStart: 4}
`

// TestMigratedMIGLayout walks docs/guides/migration.md's MIG section: a pod
// asking for the operator's existing 1g.10gb runs on it, with no MIG device
// created or destroyed; a pod asking for a 2g.20gb gets one created in the
// memory slices the layout leaves free; deleting both pods leaves exactly
// the operator's layout.
func TestMigratedMIGLayout(t *testing.T) {
	ctx := testContext(t, 4*time.Minute)
	c := startFleet(t, ctx, "migrated", migratedFleet, cluster.Options{})
	useAsDemo(t, c)
	layout := func(ctx context.Context) []hardware.MIGDevice {
		inv, err := c.SimNode("migrated-0").Hardware().Discover(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return inv.GPUs[0].MIGDevices
	}
	operators := layout(ctx)
	small := operators[0]
	if small.Profile != "1g.10gb" {
		t.Fatalf("layout %+v, want the 1g.10gb first", operators)
	}
	const ns = "migrated"
	create(t, ctx, demo, clustertest.Namespace(ns),
		clustertest.ClaimTemplate(ns, "existing-1g", clustertest.Spec(clustertest.Request("mig", "mig.nvidia.com",
			"device.attributes['gpu.nvidia.com'].profile == '1g.10gb' && device.attributes['gpu.nvidia.com'].uuid == '"+small.UUID+"'"))),
		clustertest.ClaimTemplate(ns, "new-2g", clustertest.Spec(clustertest.Request("mig", "mig.nvidia.com",
			"device.attributes['gpu.nvidia.com'].profile == '2g.20gb'"))),
		clustertest.Pod(ns, "existing-1g", clustertest.PodClaim{Template: "existing-1g"}),
		clustertest.Pod(ns, "new-2g", clustertest.PodClaim{Template: "new-2g"}))
	existing := waitForPod(t, ctx, ns, "existing-1g", "Running", running)
	if devs := devicesOf(t, ctx, existing); len(devs) != 1 || devs[0].Name != "gpu-0-mig-1g10gb-19-0" || attr(devs[0], "uuid") != small.UUID {
		t.Fatalf("existing-1g got %v, want the operator's gpu-0-mig-1g10gb-19-0 (%s)", devs, small.UUID)
	}
	created := waitForPod(t, ctx, ns, "new-2g", "Running", running)
	if devs := devicesOf(t, ctx, created); len(devs) != 1 || devs[0].Name != "gpu-0-mig-2g20gb-14-2" {
		t.Fatalf("new-2g got %v, want the only 2g.20gb placement the layout leaves, gpu-0-mig-2g20gb-14-2", devs)
	}
	if got := layout(ctx); len(got) != 3 {
		t.Errorf("MIG devices %+v, want the operator's two and the 2g.20gb", got)
	}
	deletePods(t, ctx, ns, "existing-1g", "new-2g")
	// Both claims unprepared and gone, the 2g.20gb destroyed.
	err := clustertest.Poll(ctx, 0, func() bool {
		claims, err := c.Client().ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(claims.Items) == 0 && len(layout(ctx)) == 2
	})
	got := layout(ctx)
	if err != nil || len(got) != 2 || got[0].UUID != operators[0].UUID || got[1].UUID != operators[1].UUID {
		t.Errorf("after both pods were deleted the GPU holds %+v, want exactly the operator's %+v", got, operators)
	}
}
