// Package mps starts, supervises and stops NVIDIA MPS control daemons
// (nvidia-cuda-mps-control), one per shared claim or per share of a
// fractional GPU, each with its own pipe, log and shm directories, and its
// limits (active thread percentage, pinned device memory per device) held
// by the daemon rather than by the containers' environment.
//
// Daemons outlive the plugin that starts them: a [Manager] created after a
// plugin restart or upgrade finds them through the pid file each daemon
// writes into its pipe directory, checks that the PID still names that
// daemon (not a process that was given the PID later), and adopts it. A
// daemon that its pid file does not name (its start was cut short before it
// wrote the file, or the file was removed) runs all the same: a failed
// Start, a Start that must replace it, and Stop find it in /proc by the pipe
// directory in its environment, and kill it.
//
// How a daemon is started is behind [Launcher]; [ProcessLauncher] starts it
// as a detached process, optionally as a unit of the host's systemd
// ([SystemdRun]). docs/guides/mps.md explains the choice.
package mps
