package draplugin

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
)

// staleRecheck is how long removeStaleSockets waits before it looks at a
// socket that refused a connection again: a process that has bound the
// socket but not yet called listen(2) refuses for that long at most.
const staleRecheck = 50 * time.Millisecond

// removeStaleSockets removes the sockets of earlier plugin instances of
// this driver that no process serves any more: an instance killed by
// SIGKILL (or the OOM killer) in a rolling update leaves its DRA socket
// (dra-<pod UID>.sock in the plugin data directory) and its registration
// socket (named after the pod UID in the registrar directory) behind, and
// the kubeletplugin helper only ever replaces the names of this instance.
// A stale registration socket makes the kubelet retry registering a plugin
// that is gone.
//
// A socket is stale when connecting to it is refused (ECONNREFUSED: bound
// by nobody) twice, staleRecheck apart, and it is still the same file: the
// socket of a live instance accepts, and one an instance is just creating
// accepts by the second try. Anything else (another error, a file that is
// not a socket, this instance's own names, which the helper replaces) is
// left alone. Registration sockets named only by a hash of driver and pod
// UID ("dra-<hash>-reg.sock", for driver names too long for the others)
// are looked at only when this driver's would be named so too, since they
// do not say which driver they are of. Failures are logged, never fatal.
func removeStaleSockets(logger klog.Logger, cfg Config) {
	// The names this instance listens on, which the helper replaces.
	own := map[string]bool{
		filepath.Join(cfg.PluginDataDir, "dra.sock"):                true,
		filepath.Join(cfg.RegistrarDir, cfg.DriverName+"-reg.sock"): true,
	}
	if uid := cfg.RollingUpdateUID; uid != "" {
		own = map[string]bool{
			filepath.Join(cfg.PluginDataDir, "dra-"+string(uid)+".sock"):                                                           true,
			filepath.Join(cfg.RegistrarDir, kubeletplugin.RollingUpdateRegistrarSocketFile(cfg.RegistrarDir, cfg.DriverName, uid)): true,
		}
	}
	patterns := []string{
		filepath.Join(cfg.PluginDataDir, "dra*.sock"),
		filepath.Join(cfg.RegistrarDir, cfg.DriverName+"-*reg.sock"),
	}
	// Every pod UID is as long as this one, so the helper picks the same
	// form of name for all of them.
	if name := kubeletplugin.RollingUpdateRegistrarSocketFile(cfg.RegistrarDir, cfg.DriverName, "00000000-0000-0000-0000-000000000000"); strings.HasPrefix(name, "dra-") {
		patterns = append(patterns, filepath.Join(cfg.RegistrarDir, "dra-*-reg.sock"))
	}
	var suspects []suspectSocket
	for _, pattern := range patterns {
		paths, err := filepath.Glob(pattern)
		if err != nil {
			logger.Error(err, "Looking for stale sockets", "pattern", pattern)
			continue
		}
		for _, path := range paths {
			if own[path] {
				continue
			}
			if fi, err := os.Lstat(path); err == nil && fi.Mode().Type() == fs.ModeSocket && refused(path) {
				suspects = append(suspects, suspectSocket{path: path, fi: fi})
			}
		}
	}
	if len(suspects) == 0 {
		return
	}
	time.Sleep(staleRecheck)
	for _, s := range suspects {
		if fi, err := os.Lstat(s.path); err != nil || !os.SameFile(s.fi, fi) || !refused(s.path) {
			continue
		}
		if err := os.Remove(s.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			logger.Error(err, "Removing a stale socket of an earlier plugin instance", "socket", s.path)
			continue
		}
		logger.Info("Removed the socket of an earlier plugin instance that no process serves", "socket", s.path)
	}
}

// suspectSocket is a socket that refused a connection once.
type suspectSocket struct {
	path string
	fi   fs.FileInfo
}

// refused reports whether a connection to the socket at path is refused:
// no process listens on it.
func refused(path string) bool {
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		_ = conn.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}
