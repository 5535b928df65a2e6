package mpsfake

import (
	"path/filepath"
	"slices"

	"github.com/gpudra/gpudra/internal/fakeprog"
	"github.com/gpudra/gpudra/pkg/mps"
	"github.com/gpudra/gpudra/pkg/proctable"
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

	ref proctable.Ref
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
	var t proctable.Table
	var out []Proc
	for _, ref := range fakeprog.Procs(dir) {
		argv, err := t.Cmdline(ref.PID)
		if err != nil || len(argv) == 0 {
			continue
		}
		p := Proc{PID: ref.PID, Name: filepath.Base(argv[0]), Args: argv[1:], ref: ref}
		if v, ok := t.Environ(ref.PID, mps.EnvPipeDirectory); ok {
			p.PipeDir = filepath.Clean(v)
		}
		out = append(out, p)
	}
	return out
}

// Kill sends SIGKILL to every one of procs that still runs and waits, up
// to 10 seconds, until they are gone. The error names one still running.
func Kill(procs []Proc) error {
	refs := make([]proctable.Ref, len(procs))
	for i, p := range procs {
		refs[i] = p.ref
	}
	return fakeprog.Kill(refs)
}
