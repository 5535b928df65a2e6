package mps

import (
	"os"
	"path/filepath"
	"strconv"

	"github.com/gpudra/gpudra/pkg/proctable"
)

// ServerBinaryName is the base name of the MPS server the control daemon
// spawns for its clients.
const ServerBinaryName = "nvidia-cuda-mps-server"

// procRef names one process for as long as it lives.
type procRef = proctable.Ref

// procFS reads the process table. Its root is /proc outside tests.
type procFS struct {
	proctable.Table
	// afterList, if set, runs after daemonsOf has listed the process table
	// and before it reads the processes: tests fork a process there.
	afterList func()
}

// serversOf returns the live MPS servers of the daemon whose pipe
// directory is pipe: the children of daemonPID (0 if none is known), and
// the servers whose environment names pipe, which are found even after
// their daemon crashed and left them to init.
func (p procFS) serversOf(pipe string, daemonPID int) []procRef {
	entries, err := os.ReadDir(p.Root)
	if err != nil {
		return nil
	}
	var out []procRef
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, ok := p.Alive(pid)
		if !ok || !p.IsCommand(pid, ServerBinaryName) {
			continue
		}
		if daemonPID == 0 || st.PPID != daemonPID {
			if v, found := p.Environ(pid, EnvPipeDirectory); !found || filepath.Clean(v) != pipe {
				continue
			}
		}
		out = append(out, procRef{PID: pid, StartTime: st.StartTime})
	}
	return out
}

// daemonsOf returns the live control daemons (the program named base, run
// with -d) whose environment names pipe, whatever their pid file says: a
// daemon that has not written it yet, or whose file or whole directory was
// removed, runs all the same. A -d invocation that has not forked yet looks
// the same, and is one too.
func (p procFS) daemonsOf(base, pipe string) []procRef {
	refs, _ := p.daemonsAndUnsettled(base, pipe)
	return refs
}

// daemonsAndUnsettled is daemonsOf, and whether some live user process
// had no command line to read: one in the middle of an exec (a -d
// invocation's forked daemon loading its binary shows an empty command
// line for that while), which may turn out to be a daemon of pipe.
func (p procFS) daemonsAndUnsettled(base, pipe string) (out []procRef, unsettled bool) {
	entries, err := os.ReadDir(p.Root)
	if err != nil {
		return nil, false
	}
	if p.afterList != nil {
		p.afterList()
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if !p.IsCommand(pid, base, "-d") {
			if argv, err := p.Cmdline(pid); err == nil && len(argv) == 1 && argv[0] == "" {
				if st, ok := p.Alive(pid); ok && pid != kthreadd && st.PPID != kthreadd {
					unsettled = true
				}
			}
			continue
		}
		if v, found := p.Environ(pid, EnvPipeDirectory); !found || filepath.Clean(v) != pipe {
			continue
		}
		if st, ok := p.Alive(pid); ok {
			out = append(out, procRef{PID: pid, StartTime: st.StartTime})
		}
	}
	return out, unsettled
}

// kthreadd is the PID of the kernel's thread daemon: it and its children,
// the kernel threads, have no command line.
const kthreadd = 2
