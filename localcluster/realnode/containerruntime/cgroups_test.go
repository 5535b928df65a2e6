package containerruntime_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpudra/gpudra/localcluster/realnode/containerruntime"
)

// TestContainerGetsKubeletResources runs a container with the pod cgroup
// parent, limits and OOM score adjustment the kubelet sets (see
// testNode.run) and reads from inside it what it got: its memory limit,
// its cgroup below the pod's, and an OOM score adjustment no lower than
// containerd's own (restrict_oom_score_adj: the machines lack
// CAP_SYS_RESOURCE, so -997 cannot be granted).
func TestContainerGetsKubeletResources(t *testing.T) {
	realNode(t)
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	n := startNode(t, ctx, dir, filepath.Join(dir, "cdi"))
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil {
		t.Fatal(err)
	}
	v2 := st.Type == unix.CGROUP2_SUPER_MAGIC
	limitFile := "/sys/fs/cgroup/memory/memory.limit_in_bytes"
	if v2 {
		limitFile = "/sys/fs/cgroup/memory.max"
	}
	out := n.run(t, ctx, "resources", &runtimeapi.ContainerConfig{
		Image: &runtimeapi.ImageSpec{Image: containerruntime.TestImage},
		Command: []string{"/bin/sh", "-c", fmt.Sprintf(
			"echo limit $(cat %s); echo oom $(cat /proc/self/oom_score_adj); sed 's/^/cgroup /' /proc/self/cgroup", limitFile)},
	})
	own, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		t.Fatal(err)
	}
	wantOOM := strings.TrimSpace(string(own)) // containerd inherits the test's
	var cgroups []string
	for _, line := range out {
		kind, rest, _ := strings.Cut(line, " ")
		switch kind {
		case "limit":
			if rest != fmt.Sprint(256<<20) {
				t.Errorf("memory limit %s, want %d", rest, 256<<20)
			}
		case "oom":
			if rest != wantOOM {
				t.Errorf("oom_score_adj %s, want containerd's own %s (restricted from -997)", rest, wantOOM)
			}
		case "cgroup":
			cgroups = append(cgroups, rest)
		}
	}
	// With cgroup v1 and no cgroup namespace, the container's cgroup
	// paths show the pod cgroup the kubelet would have named.
	if !v2 && !slices.ContainsFunc(cgroups, func(c string) bool {
		return strings.Contains(c, fmt.Sprintf("/gpudra-realnode-test-%d/podresources/", os.Getpid()))
	}) {
		t.Errorf("container's cgroups %q are not below the pod cgroup", cgroups)
	}
}
