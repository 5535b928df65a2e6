package mps

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Names inside a daemon's directory.
const (
	// PIDFileName is the file in which the control daemon writes its PID,
	// in its pipe directory (NVIDIA's documented interface).
	PIDFileName = "nvidia-cuda-mps-control.pid"
	// ControlSocketName is the control daemon's socket in its pipe
	// directory; clients find the daemon through it.
	ControlSocketName = "control"
	// ControlLogName is the control daemon's log in its log directory.
	ControlLogName = "control.log"

	// MaxPipeDirLength bounds the pipe directory's path. The daemon binds
	// unix sockets in it, and a socket's path must fit in 107 bytes; this
	// leaves room for names up to 26 bytes ("control_privileged" is 18).
	MaxPipeDirLength = 80

	stateFileName  = "daemon.json"
	launchOutName  = "launch.out"
	stateVersionV1 = "v1"
)

// Dirs are the host paths of one daemon's files.
type Dirs struct {
	// Root holds everything below and gpudra's record of the daemon.
	Root string
	// Pipe is the daemon's CUDA_MPS_PIPE_DIRECTORY: its socket, pid file
	// and pipes. Clients must see it.
	Pipe string
	// Log is the daemon's CUDA_MPS_LOG_DIRECTORY: control.log and
	// server.log.
	Log string
	// Shm is the /dev/shm that the daemon's servers and their clients
	// share, and no one else.
	Shm string
}

// DirsOf returns the directories of the daemon with the given ID under a
// Manager's root.
func DirsOf(root, id string) Dirs { return dirsFor(root, id) }

func dirsFor(root, id string) Dirs {
	r := filepath.Join(root, id)
	return Dirs{Root: r, Pipe: filepath.Join(r, "pipe"), Log: filepath.Join(r, "log"), Shm: filepath.Join(r, "shm")}
}

// create makes the directories. Pipe and log directories are 0755: the
// servers the daemon spawns run under the client's user ID and must reach
// them (so must every parent directory up to /). Shm is world-writable and
// sticky, like /dev/shm, because clients of any user create files there.
func (d Dirs) create() error {
	for _, dir := range []string{d.Root, d.Pipe, d.Log, d.Shm} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		// Explicitly, whatever the process umask is.
		mode := os.FileMode(0o755)
		if dir == d.Shm {
			mode = 0o777 | os.ModeSticky
		}
		if err := os.Chmod(dir, mode); err != nil {
			return err
		}
	}
	return nil
}

// state is gpudra's on-disk record of one daemon, next to the daemon's own
// files, so that a restarted or upgraded plugin finds everything it needs
// to adopt, supervise and stop the daemon without its own checkpoint.
//
// The format is versioned: a later version adds fields and keeps reading
// v1, and never changes the meaning of a v1 field.
type state struct {
	Version string `json:"version"`
	Spec    Spec   `json:"spec"`
	// Daemon is the control daemon process gpudra last started or adopted;
	// nil between writing the spec and the daemon being up.
	Daemon *procRef `json:"daemon,omitempty"`
	// BootID is the boot Daemon.StartTime belongs to.
	BootID string `json:"bootID,omitempty"`
	// Restarts counts the times a daemon that had died was started again.
	Restarts int `json:"restarts,omitempty"`
}

func readState(d Dirs) (*state, error) {
	data, err := os.ReadFile(filepath.Join(d.Root, stateFileName))
	if err != nil {
		return nil, err
	}
	var s state
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("decode %s: %w", filepath.Join(d.Root, stateFileName), err)
	}
	if s.Version != stateVersionV1 {
		return nil, fmt.Errorf("%s: version %q, this gpudra reads %q", filepath.Join(d.Root, stateFileName), s.Version, stateVersionV1)
	}
	return &s, nil
}

// writeState replaces the record atomically (temp file, rename): a crash
// leaves the old record or the new one, never a torn one. It is not
// fsynced: after a power loss the daemon is gone as well, and the record's
// spec is rewritten by the next Start.
func writeState(d Dirs, s *state) error {
	s.Version = stateVersionV1
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	f, err := os.CreateTemp(d.Root, "."+stateFileName+".*")
	if err != nil {
		return err
	}
	_, werr := f.Write(append(data, '\n'))
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), filepath.Join(d.Root, stateFileName)); err != nil {
		_ = os.Remove(f.Name())
		return err
	}
	return nil
}

// readPIDFile returns the PID the daemon wrote into its pipe directory.
func readPIDFile(d Dirs) (int, error) {
	data, err := os.ReadFile(filepath.Join(d.Pipe, PIDFileName))
	if err != nil {
		return 0, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("%s: %q is not a PID", filepath.Join(d.Pipe, PIDFileName), strings.TrimSpace(string(data)))
	}
	return pid, nil
}
