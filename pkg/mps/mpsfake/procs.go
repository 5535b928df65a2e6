package mpsfake

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gpudra/gpudra/pkg/mps"
)

// Proc is a live fake process.
type Proc struct {
	PID int
	// Name is the fake program it runs: [ControlName], [ServerName] or
	// [SleeperName].
	Name string
	// Args are its arguments after the program.
	Args []string
	// PipeDir is its CUDA_MPS_PIPE_DIRECTORY; "" if it has none.
	PipeDir string

	startTime string
}

// IsDaemon reports whether p is a control daemon (or a -d invocation about
// to fork one), not a client.
func (p Proc) IsDaemon() bool {
	return p.Name == ControlName && slices.Contains(p.Args, "-d")
}

// Procs returns the live fake processes run from the programs that
// [Install] put in dir. They are found by their command line in /proc,
// whoever their parent is: a daemon is nobody's child, and the servers of a
// killed daemon are init's.
func Procs(dir string) []Proc {
	dir = filepath.Clean(dir)
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []Proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(data) == 0 {
			continue
		}
		argv := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
		if filepath.Dir(argv[0]) != dir {
			continue
		}
		start, ok := liveStartTime(pid)
		if !ok {
			continue
		}
		p := Proc{PID: pid, Name: filepath.Base(argv[0]), Args: argv[1:], startTime: start}
		if env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ")); err == nil {
			for _, kv := range bytes.Split(env, []byte{0}) {
				if v, ok := bytes.CutPrefix(kv, []byte(mps.EnvPipeDirectory+"=")); ok {
					p.PipeDir = filepath.Clean(string(v))
				}
			}
		}
		out = append(out, p)
	}
	return out
}

// Kill sends SIGKILL to every one of procs that still runs and waits, up
// to 10 seconds, until they are gone. The error names those still running.
func Kill(procs []Proc) error {
	for _, p := range procs {
		if p.same() {
			_ = syscall.Kill(p.PID, syscall.SIGKILL)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, p := range procs {
		for p.same() {
			if time.Now().After(deadline) {
				return fmt.Errorf("pid %d (%s %v) still running 10s after SIGKILL", p.PID, p.Name, p.Args)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return nil
}

// same reports whether p's PID still names the process p was taken from.
func (p Proc) same() bool {
	start, ok := liveStartTime(p.PID)
	return ok && start == p.startTime
}

// liveStartTime returns the start time of pid (field 22 of its stat) if it
// is a process that has not exited; a zombie has.
func liveStartTime(pid int) (string, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", false
	}
	s := string(data)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return "", false
	}
	return f[19], true
}
