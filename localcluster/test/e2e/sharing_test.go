package e2e

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpudra/gpudra/internal/mpsfake"
	"github.com/gpudra/gpudra/localcluster/test/clustertest"
	"github.com/gpudra/gpudra/pkg/mps"
)

// TestMPSClaim: a claim with sharing strategy MPS, used by two containers,
// gets its own MPS daemon with the config's limits; both containers' CDI
// edits carry its pipe directory; deleting the pod stops the daemon.
func TestMPSClaim(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	const ns = "mps-claim"
	applyObjects(t, ctx, demo, loadTestdata(t, ns, "mps-claim.yaml", "mps-pod-two-containers.yaml"))
	pod := waitForPod(t, ctx, ns, "pod", "Running", running)
	devs := devicesOf(t, ctx, pod)
	if len(devs) != 1 {
		t.Fatalf("got %d devices, want 1", len(devs))
	}
	uid := claimUIDs(t, ctx, pod)[0]
	node := demo.SimNode(pod.Spec.NodeName)
	dirs := node.MPSDirs(uid)
	rec, err := mpsfake.ReadRecord(dirs.Log)
	if err != nil {
		t.Fatalf("the claim's MPS daemon did not start: %v", err)
	}
	gpu := attr(devs[0], "uuid")
	if rec.ActiveThreadPercentage == nil || *rec.ActiveThreadPercentage != 25 || rec.PinnedMemLimitMiB[gpu] != 20*1024 || !slices.Equal(rec.VisibleDevices, []string{gpu}) {
		t.Errorf("daemon serves %v with threads %v and pinned memory %v MiB; want %s, 25, 20480", rec.VisibleDevices, rec.ActiveThreadPercentage, rec.PinnedMemLimitMiB, gpu)
	}
	ctrs, _ := node.Containers(pod)
	for _, name := range []string{"a", "b"} {
		c := ctrs[name]
		if c.Env[mps.EnvPipeDirectory] != mps.ContainerPipeDir || !slices.Contains(c.Mounts, mps.ContainerPipeDir) || !slices.Contains(c.Mounts, mps.ContainerShmDir) {
			t.Errorf("container %s: env %v, mounts %v; want %s=%s and the pipe and shm mounts", name, c.Env, c.Mounts, mps.EnvPipeDirectory, mps.ContainerPipeDir)
		}
	}
	checkContainersSeeDevices(t, pod, devs)
	checkInfoMetric(t, ctx, pod, gpu, "", "")

	if err := demo.Client().CoreV1().Pods(ns).Delete(ctx, "pod", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err = clustertest.Poll(ctx, time.Minute, func() bool {
		_, err := os.Stat(dirs.Root)
		return os.IsNotExist(err)
	})
	if err != nil {
		t.Fatalf("the MPS daemon's directory %s is still there after the pod was deleted", dirs.Root)
	}
	if mpsfake.Alive(rec.PID) {
		t.Errorf("MPS daemon pid %d still runs after its claim was unprepared", rec.PID)
	}
	// The daemon's directory goes before the Unprepare ends: the claim's
	// checkpoint entry and CDI spec go last.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		return !checkpointHas(t, pod.Spec.NodeName, uid) && len(specFilesFor(t, pod.Spec.NodeName, uid)) == 0, nil
	})
	if err != nil {
		t.Errorf("claim %s still prepared on %s", uid, pod.Spec.NodeName)
	}
}
