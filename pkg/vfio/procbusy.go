package vfio

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ProcHolders implements [BusyChecker] from procfs: the GPU's minor comes
// from the NVIDIA driver's /proc/driver/nvidia/gpus/<busID>/information,
// and a holder is every process with /dev/nvidia<minor> open, which
// includes nvidia-persistenced and Fabric Manager. Reading other processes'
// descriptors needs the privileges the plugin has (and hostPID).
type ProcHolders struct {
	// Root is procfs, "/proc" when empty.
	Root string
}

// Holders implements [BusyChecker].
func (p ProcHolders) Holders(ctx context.Context, busID string) ([]string, error) {
	root := p.Root
	if root == "" {
		root = "/proc"
	}
	minor, err := nvidiaMinor(root, busID)
	if err != nil {
		return nil, err
	}
	node := "/dev/nvidia" + strconv.Itoa(minor)
	procs, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	var holders []string
	for _, e := range procs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if holds(filepath.Join(root, e.Name(), "fd"), node) {
			comm, _ := os.ReadFile(filepath.Join(root, e.Name(), "comm"))
			holders = append(holders, fmt.Sprintf("%s (pid %d)", strings.TrimSpace(string(comm)), pid))
		}
	}
	return holders, nil
}

// holds reports whether any descriptor in fdDir links to node. Processes
// that exit meanwhile, or whose descriptors cannot be read, hold nothing.
func holds(fdDir, node string) bool {
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		return false
	}
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join(fdDir, fd.Name())); err == nil && target == node {
			return true
		}
	}
	return false
}

// nvidiaMinor reads the GPU's device minor from the driver's procfs entry.
func nvidiaMinor(procRoot, busID string) (int, error) {
	path := filepath.Join(procRoot, "driver/nvidia/gpus", busID, "information")
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("GPU %s: find its device minor: %w", busID, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "Device Minor:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				return 0, fmt.Errorf("%s: Device Minor %q: %w", path, v, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("%s: no Device Minor line", path)
}
