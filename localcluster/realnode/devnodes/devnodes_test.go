package devnodes_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpudra/gpudra/localcluster/realnode/devnodes"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/sim"
	"github.com/gpudra/gpudra/pkg/simfleet"
)

func inventory(t *testing.T) *hardware.Inventory {
	t.Helper()
	inv, err := simfleet.Discover(context.Background(), "dgx-a100-mig", "dgx-a100-0")
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

// TestNodes checks the nodes listed for a simulated DGX A100 (8 GPUs, MIG
// on GPU 1) against the numbers gpudra's CDI specs use.
func TestNodes(t *testing.T) {
	inv := inventory(t)
	nodes, err := devnodes.Nodes(inv, devnodes.Options{IMEXChannels: 4})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path         string
		major, minor uint32
	}{
		{"/dev/nvidia0", 195, 0},
		{"/dev/nvidia7", 195, 7},
		{"/dev/nvidiactl", 195, 255},
		{"/dev/nvidia-uvm", sim.UVMMajor, 0},
		{"/dev/nvidia-uvm-tools", sim.UVMMajor, 1},
		{"/dev/nvidia-caps/nvidia-cap1", sim.CapsMajor, 1},       // config
		{"/dev/nvidia-caps/nvidia-cap2", sim.CapsMajor, 2},       // monitor
		{"/dev/nvidia-caps/nvidia-cap3", sim.CapsMajor, 3},       // gpu0/gi0/access
		{"/dev/nvidia-caps/nvidia-cap1082", sim.CapsMajor, 1082}, // gpu7/gi14/ci7/access: 3 + 135*7 + 9*14 + 1 + 7
		{"/dev/nvidia-caps-imex-channels/channel3", sim.IMEXChannelsMajor, 3},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			i := slices.IndexFunc(nodes, func(n devnodes.Node) bool { return n.Path == tc.path })
			if i < 0 {
				t.Fatalf("%s not listed", tc.path)
			}
			if n := nodes[i]; n.Major != tc.major || n.Minor != tc.minor {
				t.Errorf("%s is %d:%d, want %d:%d", tc.path, n.Major, n.Minor, tc.major, tc.minor)
			}
		})
	}
	for _, absent := range []string{"/dev/nvidia8", "/dev/nvidia-caps/nvidia-cap1083", "/dev/nvidia-caps-imex-channels/channel4"} {
		if slices.ContainsFunc(nodes, func(n devnodes.Node) bool { return n.Path == absent }) {
			t.Errorf("%s listed; the node has no such device", absent)
		}
	}
	// 3 control nodes, 8 GPUs, config and monitor, 135 MIG caps per GPU,
	// 4 IMEX channels.
	if want := 3 + 8 + 2 + 8*135 + 4; len(nodes) != want {
		t.Errorf("%d nodes, want %d", len(nodes), want)
	}
	if _, err := devnodes.Nodes(&hardware.Inventory{}, devnodes.Options{}); err == nil {
		t.Error("an inventory without majors gave nodes, want an error")
	}
}

// TestCreate creates the nodes under a temporary dev root, twice (the
// second run keeps them), over a regular file in the way.
func TestCreate(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mknod needs root")
	}
	root := t.TempDir()
	nodes := []devnodes.Node{{"/dev/nvidia3", 195, 3}, {"/dev/nvidia-caps/nvidia-cap12", sim.CapsMajor, 12}}
	if err := os.MkdirAll(filepath.Join(root, "dev"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "dev", "nvidia3"), []byte("not a device"), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := devnodes.Create(root, nodes); err != nil {
			t.Fatal(err)
		}
		for _, n := range nodes {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(root, n.Path), &st); err != nil {
				t.Fatal(err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != unix.Mkdev(n.Major, n.Minor) || st.Mode&0o777 != 0o666 {
				t.Errorf("%s: mode %o rdev %d:%d, want a 0666 char device %d:%d", n.Path, st.Mode, unix.Major(st.Rdev), unix.Minor(st.Rdev), n.Major, n.Minor)
			}
		}
	}
}
