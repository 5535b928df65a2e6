package imex

import (
	"context"

	"github.com/gpudra/gpudra/pkg/proctable"
)

// Launcher starts the daemon so that it outlives the plugin. The
// [Supervisor] finds it afterwards in /proc by its program name and its
// config path, whatever the launcher, so the daemon's PID must be visible
// in the plugin's PID namespace (hostPID).
type Launcher interface {
	// Launch runs argv (nvidia-imex -c <config>, which forks the daemon
	// into the background and exits) with env, writing its output to
	// outPath.
	Launch(ctx context.Context, argv, env []string, outPath string) error
}

// Launcher names accepted by [NewLauncher].
const (
	LauncherProcess    = "process"
	LauncherSystemdRun = "systemd-run"
)

// ProcessLauncher starts the daemon as a process of the plugin's session,
// detached (a session of its own). Enough where the plugin runs on the
// host; in a container the daemon would die with the container's cgroup:
// use [SystemdRunLauncher] there, as pkg/mps does for MPS daemons.
type ProcessLauncher struct{}

// Launch implements [Launcher].
func (ProcessLauncher) Launch(ctx context.Context, argv, env []string, outPath string) error {
	return proctable.Detached{Argv: argv, Env: env, OutPath: outPath}.Run(ctx)
}

// SystemdRunLauncher starts the daemon as a transient forking service of
// the host's systemd, in a cgroup of its own. Paths must be host paths.
type SystemdRunLauncher struct {
	proctable.SystemdRun
	// Unit is the service's name.
	Unit string
}

// Launch implements [Launcher].
func (l SystemdRunLauncher) Launch(ctx context.Context, argv, env []string, outPath string) error {
	unit := l.Unit
	if unit == "" {
		unit = "gpudra-imex"
	}
	full := l.Argv(unit, nil, env, argv)
	return proctable.Detached{Argv: full, Env: proctable.SystemdRunEnv, OutPath: outPath}.Run(ctx)
}
