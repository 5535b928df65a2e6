package mps

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// ServerBinaryName is the base name of the MPS server the control daemon
// spawns for its clients.
const ServerBinaryName = "nvidia-cuda-mps-server"

// procStat is what gpudra needs from /proc/<pid>/stat.
type procStat struct {
	state byte
	ppid  int
	// startTime is the time the process started, in clock ticks since
	// boot. With the boot ID it tells one process from a later one that
	// was given the same PID.
	startTime uint64
}

// parseProcStat parses the content of /proc/<pid>/stat. The command name
// (field 2) is in parentheses and may itself contain spaces and
// parentheses, so the fields after it are found from the last ')'.
func parseProcStat(data []byte) (procStat, error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return procStat{}, errors.New("no ')' after the command name")
	}
	fields := strings.Fields(string(data[end+1:]))
	// fields[0] is field 3 (state); starttime is field 22.
	if len(fields) < 20 {
		return procStat{}, fmt.Errorf("%d fields after the command name, want at least 20", len(fields))
	}
	if len(fields[0]) != 1 {
		return procStat{}, fmt.Errorf("state %q is not one character", fields[0])
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		return procStat{}, fmt.Errorf("ppid: %w", err)
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return procStat{}, fmt.Errorf("starttime: %w", err)
	}
	return procStat{state: fields[0][0], ppid: ppid, startTime: start}, nil
}

// procFS reads the process table. Its root is /proc outside tests.
type procFS struct {
	root string
	// afterList, if set, runs after daemonsOf has listed the process table
	// and before it reads the processes: tests fork a process there.
	afterList func()
}

func (p procFS) stat(pid int) (procStat, error) {
	data, err := os.ReadFile(filepath.Join(p.root, strconv.Itoa(pid), "stat"))
	if err != nil {
		return procStat{}, err
	}
	st, err := parseProcStat(data)
	if err != nil {
		return procStat{}, fmt.Errorf("parse %s/%d/stat: %w", p.root, pid, err)
	}
	return st, nil
}

// alive reports whether pid is a process that has not exited. A zombie has
// exited: it is only waiting for a parent to collect its status, which a
// container's init may never do.
func (p procFS) alive(pid int) (procStat, bool) {
	st, err := p.stat(pid)
	if err != nil || st.state == 'Z' || st.state == 'X' || st.state == 'x' {
		return st, false
	}
	return st, true
}

// exiting reports whether ref is a process that has exited in part: its
// main thread is gone (a zombie, so alive is false) but other threads
// still run their exit. Until the last one has, the process keeps its
// files open and so its locks: a daemon started again in that window
// finds the pipe directory still locked and refuses to run.
func (p procFS) exiting(ref procRef) bool {
	st, err := p.stat(ref.PID)
	if err != nil || st.startTime != ref.StartTime {
		return false
	}
	tasks, err := os.ReadDir(filepath.Join(p.root, strconv.Itoa(ref.PID), "task"))
	return err == nil && len(tasks) > 1
}

func (p procFS) cmdline(pid int) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(p.root, strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimRight(string(data), "\x00"), "\x00"), nil
}

// environ returns the value of key in the initial environment of pid.
// Reading another process's environment needs the same user or
// CAP_SYS_PTRACE; found is false when it cannot be read.
func (p procFS) environ(pid int, key string) (value string, found bool) {
	data, err := os.ReadFile(filepath.Join(p.root, strconv.Itoa(pid), "environ"))
	if err != nil {
		return "", false
	}
	for _, kv := range strings.Split(string(data), "\x00") {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v, true
		}
	}
	return "", false
}

// isCommand reports whether pid runs the program named base with every one
// of args among its arguments.
func (p procFS) isCommand(pid int, base string, args ...string) bool {
	argv, err := p.cmdline(pid)
	if err != nil || len(argv) == 0 || filepath.Base(argv[0]) != base {
		return false
	}
	for _, a := range args {
		if !slices.Contains(argv[1:], a) {
			return false
		}
	}
	return true
}

// serversOf returns the live MPS servers of the daemon whose pipe
// directory is pipe: the children of daemonPID (0 if none is known), and
// the servers whose environment names pipe, which are found even after
// their daemon crashed and left them to init.
func (p procFS) serversOf(pipe string, daemonPID int) []procRef {
	entries, err := os.ReadDir(p.root)
	if err != nil {
		return nil
	}
	var out []procRef
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, ok := p.alive(pid)
		if !ok || !p.isCommand(pid, ServerBinaryName) {
			continue
		}
		if daemonPID == 0 || st.ppid != daemonPID {
			if v, found := p.environ(pid, EnvPipeDirectory); !found || filepath.Clean(v) != pipe {
				continue
			}
		}
		out = append(out, procRef{PID: pid, StartTime: st.startTime})
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
	entries, err := os.ReadDir(p.root)
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
		if !p.isCommand(pid, base, "-d") {
			if argv, err := p.cmdline(pid); err == nil && len(argv) == 1 && argv[0] == "" {
				if st, ok := p.alive(pid); ok && pid != kthreadd && st.ppid != kthreadd {
					unsettled = true
				}
			}
			continue
		}
		if v, found := p.environ(pid, EnvPipeDirectory); !found || filepath.Clean(v) != pipe {
			continue
		}
		if st, ok := p.alive(pid); ok {
			out = append(out, procRef{PID: pid, StartTime: st.startTime})
		}
	}
	return out, unsettled
}

// kthreadd is the PID of the kernel's thread daemon: it and its children,
// the kernel threads, have no command line.
const kthreadd = 2

// procRef names one process for as long as it lives: a PID alone may be
// given to another process once this one is gone.
type procRef struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
}

// same reports whether ref still names the process it was taken from.
func (p procFS) same(ref procRef) bool {
	st, ok := p.alive(ref.PID)
	return ok && st.startTime == ref.StartTime
}

// kill sends sig to ref if, and only if, ref still names the same process.
// Between the check and the kill the process could exit and its PID be
// reused; that window is a few microseconds, against the seconds a PID
// takes to wrap on a busy node.
func (p procFS) kill(ref procRef, sig syscall.Signal) error {
	if !p.same(ref) {
		return nil
	}
	if err := syscall.Kill(ref.PID, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %v to pid %d: %w", sig, ref.PID, err)
	}
	return nil
}

// readBootID returns the ID of the current boot, or "" when it cannot be
// read (then start times are not trusted across restarts).
func readBootID(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}
