// Package fakeprog installs fake programs for tests and the local cluster:
// symlinks, under the real programs' names, to the running executable,
// which looks at the name it was started by (os.Args[0]) and runs the fake
// instead of itself. internal/mpsfake and internal/imexfake use it, so a
// test binary or gpudra-sim carries every fake daemon it needs with no
// separate build.
package fakeprog

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpudra/gpudra/pkg/proctable"
)

// Install makes dir hold the fake programs names: symlinks to the running
// executable, which must dispatch on its base name first thing.
func Install(dir string, names ...string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	for _, name := range names {
		link := filepath.Join(dir, name)
		if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if err := os.Symlink(exe, link); err != nil {
			return err
		}
	}
	return nil
}

// Procs returns the live processes started from a program in dir, found
// by their command line in /proc whoever their parent is (a daemon is
// nobody's child). This process is left out.
func Procs(dir string) []proctable.Ref {
	dir = filepath.Clean(dir)
	t := proctable.Table{}
	var out []proctable.Ref
	for _, pid := range t.PIDs() {
		if pid == os.Getpid() {
			continue
		}
		argv, err := t.Cmdline(pid)
		if err != nil || len(argv) == 0 || filepath.Dir(argv[0]) != dir {
			continue
		}
		if st, ok := t.Alive(pid); ok {
			out = append(out, proctable.Ref{PID: pid, StartTime: st.StartTime})
		}
	}
	return out
}

// Kill sends SIGKILL to every one of refs still running and waits, up to
// 10 seconds, until they are gone; the error names one still running.
func Kill(refs []proctable.Ref) error {
	t := proctable.Table{}
	for _, r := range refs {
		_ = t.Kill(r, syscall.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, r := range refs {
		for t.Same(r) {
			if time.Now().After(deadline) {
				return errors.New("pid " + strconv.Itoa(r.PID) + " still running 10s after SIGKILL")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}

// MaxLifetime reads a fake's last-resort lifetime from the environment
// variable env (a Go duration; 0 for none), def when unset or bad. A fake
// daemon of a test binary killed before its cleanup ran ends by itself.
func MaxLifetime(env string, def time.Duration) time.Duration {
	if v := strings.TrimSpace(os.Getenv(env)); v != "" {
		if d, err := time.ParseDuration(v); err == nil {
			return d
		}
	}
	return def
}
