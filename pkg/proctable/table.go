package proctable

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

// Stat is what gpudra needs from /proc/<pid>/stat.
type Stat struct {
	// State is the one-letter process state (R, S, D, Z, ...).
	State byte
	// PPID is the parent's PID.
	PPID int
	// StartTime is the time the process started, in clock ticks since
	// boot. With the boot ID it tells one process from a later one that
	// was given the same PID.
	StartTime uint64
}

// ParseStat parses the content of /proc/<pid>/stat. The command name
// (field 2) is in parentheses and may itself contain spaces and
// parentheses, so the fields after it are found from the last ')'.
func ParseStat(data []byte) (Stat, error) {
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return Stat{}, errors.New("no ')' after the command name")
	}
	fields := strings.Fields(string(data[end+1:]))
	// fields[0] is field 3 (state); starttime is field 22.
	if len(fields) < 20 {
		return Stat{}, fmt.Errorf("%d fields after the command name, want at least 20", len(fields))
	}
	if len(fields[0]) != 1 {
		return Stat{}, fmt.Errorf("state %q is not one character", fields[0])
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		return Stat{}, fmt.Errorf("ppid: %w", err)
	}
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return Stat{}, fmt.Errorf("starttime: %w", err)
	}
	return Stat{State: fields[0][0], PPID: ppid, StartTime: start}, nil
}

// Ref names one process for as long as it lives: a PID alone may be given
// to another process once this one is gone.
type Ref struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
}

// Table reads the process table. Its Root is /proc outside tests; the zero
// Table reads /proc.
type Table struct {
	Root string
}

func (p Table) root() string {
	if p.Root == "" {
		return "/proc"
	}
	return p.Root
}

// Stat reads /proc/<pid>/stat.
func (p Table) Stat(pid int) (Stat, error) {
	data, err := os.ReadFile(filepath.Join(p.root(), strconv.Itoa(pid), "stat"))
	if err != nil {
		return Stat{}, err
	}
	st, err := ParseStat(data)
	if err != nil {
		return Stat{}, fmt.Errorf("parse %s/%d/stat: %w", p.root(), pid, err)
	}
	return st, nil
}

// Alive reports whether pid is a process that has not exited. A zombie has
// exited: it is only waiting for a parent to collect its status, which a
// container's init may never do.
func (p Table) Alive(pid int) (Stat, bool) {
	st, err := p.Stat(pid)
	if err != nil || st.State == 'Z' || st.State == 'X' || st.State == 'x' {
		return st, false
	}
	return st, true
}

// Exiting reports whether ref is a process that has exited in part: its
// main thread is gone (a zombie, so Alive is false) but other threads
// still run their exit. Until the last one has, the process keeps its
// files open and so its locks and listening sockets: a daemon started
// again in that window finds them taken and refuses to run.
func (p Table) Exiting(ref Ref) bool {
	st, err := p.Stat(ref.PID)
	if err != nil || st.StartTime != ref.StartTime {
		return false
	}
	tasks, err := os.ReadDir(filepath.Join(p.root(), strconv.Itoa(ref.PID), "task"))
	return err == nil && len(tasks) > 1
}

// Cmdline returns the command line of pid.
func (p Table) Cmdline(pid int) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(p.root(), strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimRight(string(data), "\x00"), "\x00"), nil
}

// Environ returns the value of key in the initial environment of pid.
// Reading another process's environment needs the same user or
// CAP_SYS_PTRACE; found is false when it cannot be read.
func (p Table) Environ(pid int, key string) (value string, found bool) {
	data, err := os.ReadFile(filepath.Join(p.root(), strconv.Itoa(pid), "environ"))
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

// IsCommand reports whether pid runs the program named base with every one
// of args among its arguments.
func (p Table) IsCommand(pid int, base string, args ...string) bool {
	argv, err := p.Cmdline(pid)
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

// PIDs lists the PIDs of the process table.
func (p Table) PIDs() []int {
	entries, err := os.ReadDir(p.root())
	if err != nil {
		return nil
	}
	out := make([]int, 0, len(entries))
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// Find returns the live processes running the program named base with
// every one of args among their arguments, whoever their parent is.
func (p Table) Find(base string, args ...string) []Ref {
	var out []Ref
	for _, pid := range p.PIDs() {
		if !p.IsCommand(pid, base, args...) {
			continue
		}
		if st, ok := p.Alive(pid); ok {
			out = append(out, Ref{PID: pid, StartTime: st.StartTime})
		}
	}
	return out
}

// Same reports whether ref still names the process it was taken from.
func (p Table) Same(ref Ref) bool {
	st, ok := p.Alive(ref.PID)
	return ok && st.StartTime == ref.StartTime
}

// Kill sends sig to ref if, and only if, ref still names the same process.
// Between the check and the kill the process could exit and its PID be
// reused; that window is a few microseconds, against the seconds a PID
// takes to wrap on a busy node.
func (p Table) Kill(ref Ref, sig syscall.Signal) error {
	if !p.Same(ref) {
		return nil
	}
	if err := syscall.Kill(ref.PID, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %v to pid %d: %w", sig, ref.PID, err)
	}
	return nil
}

// BootID returns the ID of the current boot read from path, or "" when it
// cannot be read (then start times are not trusted across restarts).
func BootID(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(data))
}

// Tail returns the last n bytes of the file at path, trimmed; "" when it
// cannot be read. Errors quote a daemon's log with it.
func Tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(st.Size()-n, 0)
	buf := make([]byte, st.Size()-off)
	k, _ := f.ReadAt(buf, off)
	return strings.TrimSpace(string(buf[:k]))
}
