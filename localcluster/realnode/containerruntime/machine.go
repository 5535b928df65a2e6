package containerruntime

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// CheckMachine reports what this machine lacks to run a real node, or nil:
// root (containerd and runc create namespaces, mounts and device nodes),
// the overlay filesystem (the snapshotter), and the cgroup controllers
// runc needs (cgroup v1 with cpu, memory, pids and devices mounted, or
// cgroup v2). Every missing thing is named in the error.
func CheckMachine(dir string) error {
	var errs []error
	if os.Geteuid() != 0 {
		errs = append(errs, errors.New("not root: containerd and runc need root"))
	}
	if ok, err := hasFilesystem("overlay"); err != nil {
		errs = append(errs, err)
	} else if !ok {
		errs = append(errs, errors.New("no overlay filesystem in /proc/filesystems (modprobe overlay)"))
	}
	if err := checkCgroups(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("this machine cannot run a real node: %w", err)
	}
	return nil
}

func hasFilesystem(name string) (bool, error) {
	f, err := os.Open("/proc/filesystems")
	if err != nil {
		return false, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 0 && fields[len(fields)-1] == name {
			return true, nil
		}
	}
	return false, s.Err()
}

// checkCgroups accepts cgroup v2 (a cgroup2 mount at /sys/fs/cgroup) or
// v1 with the controllers runc and the kubelet use.
func checkCgroups() error {
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/cgroup", &st); err != nil {
		return fmt.Errorf("no cgroup filesystem at /sys/fs/cgroup: %w", err)
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		return nil
	}
	mounts, err := mountinfo.GetMounts(mountinfo.FSTypeFilter("cgroup"))
	if err != nil {
		return fmt.Errorf("read mounts: %w", err)
	}
	var missing []string
	for _, want := range []string{"cpu", "memory", "pids", "devices"} {
		if !slices.ContainsFunc(mounts, func(m *mountinfo.Info) bool {
			return slices.Contains(strings.Split(m.VFSOptions, ","), want)
		}) {
			missing = append(missing, want)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("cgroup v1 controllers not mounted: %s", strings.Join(missing, ", "))
	}
	return nil
}

// onOverlay reports whether dir lies on overlayfs, where the overlayfs
// snapshotter cannot keep its layers.
func onOverlay(dir string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return false, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return st.Type == unix.OVERLAYFS_SUPER_MAGIC, nil
}

// snapshotterRoot is the overlayfs snapshotter's directory: root when
// set (refused on overlayfs), else under the node's root directory, or,
// when that lies on overlayfs, a new directory under /dev/shm (owned: the
// caller removes it).
func snapshotterRoot(l layout, root string) (_ string, owned bool, _ error) {
	explicit := root != ""
	if !explicit {
		root = filepath.Join(l.root(), "io.containerd.snapshotter.v1.overlayfs")
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return "", false, fmt.Errorf("real node runtime: snapshotter root: %w", err)
	}
	over, err := onOverlay(root)
	switch {
	case err != nil:
		return "", false, fmt.Errorf("real node runtime: %w", err)
	case !over:
		return root, false, nil
	case explicit:
		return "", false, fmt.Errorf("real node runtime: Config.SnapshotterRoot %s lies on overlayfs, which the overlayfs snapshotter cannot use; name a directory on another filesystem (e.g. under /dev/shm)", root)
	}
	shm, err := os.MkdirTemp("/dev/shm", "gpudra-snapshots-")
	if err != nil {
		return "", false, fmt.Errorf("real node runtime: %s lies on overlayfs, and no directory for the snapshotter could be made in /dev/shm: %w", l.dir, err)
	}
	if over, err := onOverlay(shm); err != nil || over {
		_ = os.RemoveAll(shm)
		return "", false, fmt.Errorf("real node runtime: %s and /dev/shm lie on overlayfs (%v), which the overlayfs snapshotter cannot use: set Config.SnapshotterRoot", l.dir, err)
	}
	return shm, true, nil
}

// shareMount bind-mounts dir onto itself and makes it a shared mount, so
// that mounts made under it (pod volumes, containers' rootfs) propagate as
// the kubelet and runc expect; the machine's / may be private.
func shareMount(dir string) error {
	if err := unix.Mount(dir, dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind-mount %s onto itself: %w", dir, err)
	}
	if err := unix.Mount("", dir, "", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
		_ = unix.Unmount(dir, unix.MNT_DETACH)
		return fmt.Errorf("make %s a shared mount: %w", dir, err)
	}
	return nil
}

// unmountUnder unmounts every mount at or below dir, deepest first
// (containers' rootfs, sandboxes' shm and network namespaces, then dir's
// own bind mounts).
func unmountUnder(dir string) error {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return fmt.Errorf("read mounts under %s: %w", dir, err)
	}
	// Mount IDs grow with time: the later mount first, so a bind of dir
	// onto itself that appears twice comes off in the right order.
	slices.SortFunc(mounts, func(a, b *mountinfo.Info) int {
		if d := strings.Count(b.Mountpoint, "/") - strings.Count(a.Mountpoint, "/"); d != 0 {
			return d
		}
		return b.ID - a.ID
	})
	var errs []error
	for _, m := range mounts {
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m.Mountpoint, err))
		}
	}
	return errors.Join(errs...)
}
