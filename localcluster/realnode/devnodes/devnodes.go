// Package devnodes creates real character device nodes for a simulated
// node's GPUs, so that a real container runtime can inject them: the paths
// and numbers are those gpudra's CDI specs for the node name.
package devnodes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gpudra/gpudra/pkg/features/imexchannel"
	"github.com/gpudra/gpudra/pkg/hardware"
	"github.com/gpudra/gpudra/pkg/hardware/nvmlhw"
)

// The fixed minors of the NVIDIA driver's control and UVM nodes, as the
// driver creates them.
const (
	ctlMinor      = 255
	uvmMinor      = 0
	uvmToolsMinor = 1
)

// Node is one character device node: its path under /dev and its numbers.
type Node struct {
	// Path is the node's path as containers see it, e.g. /dev/nvidia0.
	Path         string
	Major, Minor uint32
}

// Options say which optional nodes Nodes lists.
type Options struct {
	// IMEXChannels is how many IMEX channel nodes to list when the
	// inventory has an IMEX channel major; 0 lists
	// imexchannel.DefaultMaxChannels of them.
	IMEXChannels int
}

// Nodes lists every device node a CDI spec of a node with inventory inv
// can name: /dev/nvidia<minor> of each GPU and nvidiactl (major
// inv.Majors.NVIDIA, 195 on real machines); nvidia-uvm and nvidia-uvm-tools
// (inv.Majors.UVM); with a caps major, the MIG capability nodes
// /dev/nvidia-caps/nvidia-cap<N> of config, monitor and every GPU and
// compute instance of each GPU (the driver's standard minors, which MIG
// devices created on demand also get); and, with an IMEX channel major, the
// IMEX channel nodes. The simulated majors of nvidia-uvm, nvidia-caps and
// the IMEX channels are fixed (pkg/hardware/sim: 509, 510, 511) where a real
// driver gets dynamic ones.
func Nodes(inv *hardware.Inventory, opts Options) ([]Node, error) {
	m := inv.Majors
	if m.NVIDIA == 0 || m.UVM == 0 {
		return nil, fmt.Errorf("device nodes: majors unknown (nvidia=%d, nvidia-uvm=%d)", m.NVIDIA, m.UVM)
	}
	nodes := []Node{
		{"/dev/nvidiactl", uint32(m.NVIDIA), ctlMinor},
		{"/dev/nvidia-uvm", uint32(m.UVM), uvmMinor},
		{"/dev/nvidia-uvm-tools", uint32(m.UVM), uvmToolsMinor},
	}
	caps := nvmlhw.StandardMIGCapMinors()
	for _, g := range inv.GPUs {
		nodes = append(nodes, Node{fmt.Sprintf("/dev/nvidia%d", g.Minor), uint32(m.NVIDIA), uint32(g.Minor)})
	}
	if m.Caps != 0 {
		var capMinors []int
		for name, minor := range caps {
			if name == "config" || name == "monitor" || slices.ContainsFunc(inv.GPUs, func(g hardware.GPU) bool {
				return strings.HasPrefix(name, fmt.Sprintf("gpu%d/", g.Minor))
			}) {
				capMinors = append(capMinors, minor)
			}
		}
		slices.Sort(capMinors)
		for _, minor := range capMinors {
			nodes = append(nodes, Node{fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", minor), uint32(m.Caps), uint32(minor)})
		}
	}
	if m.IMEXChannels != 0 {
		n := opts.IMEXChannels
		if n == 0 {
			n = imexchannel.DefaultMaxChannels
		}
		for i := range n {
			nodes = append(nodes, Node{imexchannel.ChannelPath(i), uint32(m.IMEXChannels), uint32(i)})
		}
	}
	return nodes, nil
}

// Create makes nodes under devRoot (devRoot/dev/nvidia0 for /dev/nvidia0,
// as the plugin's --dev-root reads them), mode 0666 like the driver's. A
// node already there with the right numbers is kept; anything else at its
// path is replaced. Creating device nodes needs CAP_MKNOD.
func Create(devRoot string, nodes []Node) error {
	for _, n := range nodes {
		if err := create(devRoot, n); err != nil {
			return err
		}
	}
	return nil
}

func create(devRoot string, n Node) error {
	p := filepath.Join(devRoot, filepath.FromSlash(n.Path))
	dev := unix.Mkdev(n.Major, n.Minor)
	var st unix.Stat_t
	err := unix.Lstat(p, &st)
	switch {
	case err == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == dev:
		return nil
	case err == nil:
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("device node %s: replace: %w", p, err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("device node %s: %w", p, err)
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("device node %s: %w", p, err)
	}
	if err := unix.Mknod(p, unix.S_IFCHR|0o666, int(dev)); err != nil {
		return fmt.Errorf("device node %s (%d:%d): %w", p, n.Major, n.Minor, err)
	}
	// mknod's mode is masked by the umask.
	if err := os.Chmod(p, 0o666); err != nil {
		return fmt.Errorf("device node %s: %w", p, err)
	}
	return nil
}
