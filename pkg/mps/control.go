package mps

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"os/exec"
	"strconv"
	"strings"

	"github.com/gpudra/gpudra/pkg/proctable"
)

// Environment variables of NVIDIA's MPS interface.
const (
	EnvPipeDirectory  = "CUDA_MPS_PIPE_DIRECTORY"
	EnvLogDirectory   = "CUDA_MPS_LOG_DIRECTORY"
	EnvVisibleDevices = "CUDA_VISIBLE_DEVICES"
)

// control sends one command to the daemon of dirs through a client
// invocation of the control binary (the command on its stdin) and returns
// what the client printed. The error names the daemon, the command and the
// client's output.
func (m *Manager) control(ctx context.Context, id string, dirs Dirs, command string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.opts.commandTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.opts.binary)
	cmd.Env = proctable.MergeEnv(m.opts.clientEnv, []string{EnvPipeDirectory + "=" + dirs.Pipe, EnvLogDirectory + "=" + dirs.Log})
	cmd.Stdin = strings.NewReader(command + "\n")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// A client that hangs on a wedged daemon is killed at the timeout;
	// WaitDelay bounds the wait for anything it left holding the output.
	cmd.WaitDelay = m.opts.commandTimeout
	err := cmd.Run()
	text := strings.TrimSpace(out.String())
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return text, fmt.Errorf("daemon %s: command %q: %w: output %q", id, command, err, text)
	}
	return text, nil
}

// applyLimits sets the daemon's limits and reads them back. They are set
// as the daemon's defaults, which every server it starts from now on takes,
// and on each server already running (a server started before the limits,
// e.g. by a client that reconnected while a crashed daemon was being
// restarted, would otherwise go on without them). The control daemon is
// the only place they are set: a client's environment can lower them but
// never raise them.
//
// The commands' own output is not trusted to report failure (the client
// prints the daemon's answer, whatever it is); the read-back is.
func (m *Manager) applyLimits(ctx context.Context, spec Spec, dirs Dirs) error {
	if p := spec.ActiveThreadPercentage; p != nil {
		cmd := fmt.Sprintf("set_default_active_thread_percentage %d", *p)
		if _, err := m.control(ctx, spec.ID, dirs, cmd); err != nil {
			return err
		}
		get := "get_default_active_thread_percentage"
		out, err := m.control(ctx, spec.ID, dirs, get)
		if err != nil {
			return err
		}
		if got, ok := parsePercentage(out); !ok || got != float64(*p) {
			return fmt.Errorf("daemon %s: %q did not take: %q answers %q, want %d", spec.ID, cmd, get, out, *p)
		}
	}
	for _, uuid := range spec.DeviceUUIDs {
		limit, ok := spec.PinnedMemoryLimits[uuid]
		if !ok {
			continue
		}
		cmd := fmt.Sprintf("set_default_device_pinned_mem_limit %s %s", uuid, memLimitArg(limit))
		if _, err := m.control(ctx, spec.ID, dirs, cmd); err != nil {
			return err
		}
		get := "get_default_device_pinned_mem_limit " + uuid
		out, err := m.control(ctx, spec.ID, dirs, get)
		if err != nil {
			return err
		}
		if !memLimitShows(out, limit/MiB) {
			return fmt.Errorf("daemon %s: %q did not take: %q answers %q, want %s", spec.ID, cmd, get, out, memLimitArg(limit))
		}
	}
	if spec.ActiveThreadPercentage == nil && len(spec.PinnedMemoryLimits) == 0 {
		return nil
	}
	out, err := m.control(ctx, spec.ID, dirs, "get_server_list")
	if err != nil {
		return err
	}
	for _, field := range strings.Fields(out) {
		server, err := strconv.Atoi(field)
		if err != nil || server <= 0 {
			return fmt.Errorf("daemon %s: \"get_server_list\" answers %q, want server PIDs", spec.ID, out)
		}
		if p := spec.ActiveThreadPercentage; p != nil {
			if _, err := m.control(ctx, spec.ID, dirs, fmt.Sprintf("set_active_thread_percentage %d %d", server, *p)); err != nil {
				return err
			}
		}
		for _, uuid := range spec.DeviceUUIDs {
			if limit, ok := spec.PinnedMemoryLimits[uuid]; ok {
				if _, err := m.control(ctx, spec.ID, dirs, fmt.Sprintf("set_device_pinned_mem_limit %d %s %s", server, uuid, memLimitArg(limit))); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// parsePercentage reads the daemon's answer to a percentage query ("50",
// "50.0").
func parsePercentage(out string) (float64, bool) {
	f, err := strconv.ParseFloat(strings.TrimSpace(out), 64)
	return f, err == nil && !math.IsNaN(f)
}

// memLimitShows reports whether the daemon's answer to a pinned memory
// query shows a limit of wantMiB. Drivers answer in M, or, for a limit of
// at least 1 GiB, in whole G rounded down; both are accepted, the second
// only when it is the rounded form of wantMiB.
func memLimitShows(out string, wantMiB int64) bool {
	s := strings.TrimSpace(out)
	if len(s) < 2 {
		return false
	}
	n, err := strconv.ParseInt(s[:len(s)-1], 10, 64)
	if err != nil {
		return false
	}
	switch s[len(s)-1] {
	case 'M', 'm':
		return n == wantMiB
	case 'G', 'g':
		return n == wantMiB/1024 && wantMiB >= 1024
	}
	return false
}
