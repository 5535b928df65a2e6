package proctable

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
)

// Detached is one run of a program that starts a daemon: the daemon (or
// the program itself, if it does not fork) is put in a session of its own,
// so signals to the plugin's process group do not reach it, and the
// program's output goes to a file, not a pipe: a daemon it forks may keep
// the descriptors open, and a pipe would then never end.
type Detached struct {
	// Argv is the command line.
	Argv []string
	// Env is its whole environment.
	Env []string
	// Dir is its working directory.
	Dir string
	// OutPath receives its stdout and stderr (truncated first).
	OutPath string
}

// Run runs the program and waits for it to exit, which a program that
// forks its daemon into the background does at once. A ctx that ends kills
// it; the error then says so.
func (d Detached) Run(ctx context.Context) error {
	if len(d.Argv) == 0 {
		return fmt.Errorf("empty command line")
	}
	out, err := os.Create(d.OutPath)
	if err != nil {
		return err
	}
	defer func() { _ = out.Close() }()
	cmd := exec.CommandContext(ctx, d.Argv[0], d.Argv[1:]...)
	cmd.Env = d.Env
	cmd.Dir = d.Dir
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			// Killed because ctx ended, not failed by itself.
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return fmt.Errorf("%s: %w: output %q", strings.Join(d.Argv, " "), err, Tail(d.OutPath, 2048))
	}
	return nil
}

// MergeEnv returns base with the variables of over added, replacing those
// of the same name.
func MergeEnv(base, over []string) []string {
	names := map[string]bool{}
	for _, kv := range over {
		name, _, _ := strings.Cut(kv, "=")
		names[name] = true
	}
	out := make([]string, 0, len(base)+len(over))
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		if !names[name] {
			out = append(out, kv)
		}
	}
	return append(out, over...)
}

// EnvWithout returns this process's environment without the variables
// whose names start with one of prefixes: the plugin's own settings of a
// daemon's program must not leak into the daemon.
func EnvWithout(prefixes ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		keep := true
		for _, p := range prefixes {
			if strings.HasPrefix(kv, p) {
				keep = false
			}
		}
		if keep {
			env = append(env, kv)
		}
	}
	return env
}

// SystemdRun says how to start a program as a transient service of the
// host's systemd: it then lives in a cgroup of its own, outside the
// plugin's container, and survives the container's end.
type SystemdRun struct {
	// NsenterPath, if set, runs systemd-run inside the namespaces of the
	// host's PID 1 (nsenter --target 1 --mount --pid ...). A plugin
	// container needs it, with hostPID and privileges; a plugin on the host
	// leaves it empty.
	NsenterPath string
	// SystemdRunPath is systemd-run's path as the host sees it.
	SystemdRunPath string
}

// Argv returns the command line that starts argv as the forking service
// unit, with the given extra unit properties and environment. The unit has
// no Restart= (gpudra's supervisors restart, which systemd could not do
// with their checks) and is collected when it stops.
func (s SystemdRun) Argv(unit string, properties, env, argv []string) []string {
	var out []string
	if s.NsenterPath != "" {
		out = append(out, s.NsenterPath, "--target=1", "--mount", "--uts", "--ipc", "--net", "--pid", "--")
	}
	out = append(out, s.SystemdRunPath,
		"--unit="+unit,
		"--collect",
		"--quiet",
		"--service-type=forking",
	)
	for _, p := range properties {
		out = append(out, "--property="+p)
	}
	for _, kv := range env {
		out = append(out, "--setenv="+kv)
	}
	out = append(out, "--")
	return append(out, argv...)
}

// SystemdRunEnv is the environment systemd-run itself runs with: it only
// needs to find the bus; the service gets its environment from --setenv.
var SystemdRunEnv = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
