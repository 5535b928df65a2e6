package vfio

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// ModuleLoader loads a kernel module.
type ModuleLoader interface {
	// Load loads module and what it depends on; loading a module that is
	// already loaded succeeds.
	Load(ctx context.Context, module string) error
}

// Modprobe implements [ModuleLoader] by running modprobe.
type Modprobe struct {
	// Command is the command line that loads a module, which is appended to
	// it; nil means "modprobe". A plugin in a container whose modules live
	// on the host uses {"chroot", "/host", "modprobe"}.
	Command []string
}

// Load implements [ModuleLoader].
func (m Modprobe) Load(ctx context.Context, module string) error {
	if !validDriverName(module) || strings.HasPrefix(module, "-") {
		return fmt.Errorf("%q is not a module name", module)
	}
	command := m.Command
	if len(command) == 0 {
		command = []string{"modprobe"}
	}
	args := append(append([]string(nil), command[1:]...), module)
	cmd := exec.CommandContext(ctx, command[0], args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		if msg := strings.TrimSpace(out.String()); msg != "" {
			return fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, msg)
		}
		return fmt.Errorf("%s: %w", strings.Join(cmd.Args, " "), err)
	}
	return nil
}
