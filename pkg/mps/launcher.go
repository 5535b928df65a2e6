package mps

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/gpudra/gpudra/pkg/proctable"
)

// LaunchRequest is one control daemon to start.
type LaunchRequest struct {
	// ID is the daemon's ID (Spec.ID).
	ID string
	// Argv is the daemon's command line: the control binary, -d, and -M
	// for a multi-user daemon.
	Argv []string
	// Env is the environment the daemon needs: CUDA_MPS_PIPE_DIRECTORY,
	// CUDA_MPS_LOG_DIRECTORY, CUDA_VISIBLE_DEVICES and whatever
	// WithDaemonEnv added. A launcher adds what it needs to run programs
	// at all (PATH, library paths).
	Env []string
	// Dirs are the daemon's directories on the host.
	Dirs Dirs
}

// Launcher starts control daemons that outlive the process that asked for
// them. The Manager finds a launched daemon through the pid file it writes
// into its pipe directory, checks it in /proc, and talks to it through the
// control binary, whatever the launcher; so the daemon's PID must be
// visible in the Manager's PID namespace (the plugin runs with hostPID).
// A daemon that has not written its pid file, or lost it, is found in /proc
// by the control binary's name, -d and the CUDA_MPS_PIPE_DIRECTORY of its
// environment, so that a failed start or Stop can kill it: the daemon must
// run with req.Argv's program and req.Env's pipe directory.
type Launcher interface {
	// Launch starts the daemon and may return before it is ready; the
	// Manager waits for the pid file. The daemon must not be a process
	// that the caller's exit, or its container's, would kill.
	Launch(ctx context.Context, req LaunchRequest) error
	// Release frees what Launch set up besides the daemon process (a Pod,
	// a systemd unit) once the daemon is gone. It is idempotent.
	Release(ctx context.Context, id string) error
}

// ProcessLauncher starts the daemon as a process: the control binary with
// -d, which forks the daemon into the background and exits. The daemon is
// in a session of its own, so signals to the plugin's process group do not
// reach it, and its parent is gone, so the plugin's exit does not stop it.
//
// That is enough where the plugin runs on the host. In a container, every
// process it starts stays in the container's cgroup (the runtime kills the
// whole cgroup when the container stops) and, without hostPID, in its PID
// namespace (the kernel kills the namespace when its init exits). Wrap with
// [SystemdRun] to start the daemon as a unit of the host's systemd instead;
// see docs/guides/mps.md.
type ProcessLauncher struct {
	// Wrap, if set, rewrites the command line (and the environment it is
	// run with), e.g. to start the daemon through the host's init.
	Wrap func(req LaunchRequest) (argv, env []string)
	// BaseEnv is the environment the command runs with besides req.Env;
	// nil means this process's, without any CUDA_ variable.
	BaseEnv []string
}

var _ Launcher = ProcessLauncher{}

// Launch runs the (wrapped) command and waits for it to exit. Its output
// goes to launch.out in the log directory, not to a pipe: the daemon it
// forks may keep the descriptors open, and a pipe would then never end.
func (l ProcessLauncher) Launch(ctx context.Context, req LaunchRequest) error {
	argv, env := req.Argv, proctable.MergeEnv(l.baseEnv(), req.Env)
	if l.Wrap != nil {
		argv, env = l.Wrap(req)
	}
	run := proctable.Detached{Argv: argv, Env: env, Dir: req.Dirs.Root, OutPath: filepath.Join(req.Dirs.Log, launchOutName)}
	if err := run.Run(ctx); err != nil {
		return fmt.Errorf("launch daemon %s: %w", req.ID, err)
	}
	return nil
}

// Release does nothing: a process leaves nothing behind but its files.
func (ProcessLauncher) Release(context.Context, string) error { return nil }

func (l ProcessLauncher) baseEnv() []string {
	if l.BaseEnv != nil {
		return l.BaseEnv
	}
	// The plugin's own CUDA settings must not leak into a daemon.
	return proctable.EnvWithout("CUDA_")
}

// SystemdRunOptions configures [SystemdRun].
type SystemdRunOptions struct {
	// NsenterPath, if set, runs systemd-run inside the namespaces of the
	// host's PID 1 (nsenter --target 1 --mount --pid ...). A plugin
	// container needs it, with hostPID and privileges; a plugin on the host
	// leaves it empty.
	NsenterPath string
	// SystemdRunPath is systemd-run's path as the host sees it.
	SystemdRunPath string
	// UnitPrefix starts every unit's name; "gpudra-mps-" if empty.
	UnitPrefix string
}

// SystemdRun returns a [ProcessLauncher] Wrap that starts the daemon as a
// transient service of the host's systemd: it then lives in a cgroup of its
// own, outside the plugin's container, and survives the container's end.
// The service is Type=forking with the daemon's pid file, so systemd tracks
// the forked daemon; it has no Restart= (gpudra's supervisor restarts,
// re-applying limits, which systemd could not) and is collected when it
// stops. The claim's shm directory is bind-mounted on the service's
// /dev/shm, so servers and clients share it and nothing else. Paths in the
// request must be host paths: mount the plugin's MPS root at the same path
// inside its container.
func SystemdRun(o SystemdRunOptions) func(LaunchRequest) (argv, env []string) {
	prefix := o.UnitPrefix
	if prefix == "" {
		prefix = "gpudra-mps-"
	}
	run := proctable.SystemdRun{NsenterPath: o.NsenterPath, SystemdRunPath: o.SystemdRunPath}
	return func(req LaunchRequest) ([]string, []string) {
		argv := run.Argv(prefix+req.ID, []string{
			"PIDFile=" + filepath.Join(req.Dirs.Pipe, PIDFileName),
			"BindPaths=" + req.Dirs.Shm + ":/dev/shm",
		}, req.Env, req.Argv)
		return argv, proctable.SystemdRunEnv
	}
}
