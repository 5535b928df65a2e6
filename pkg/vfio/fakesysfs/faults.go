package fakesysfs

import (
	"errors"
	"io/fs"
)

// Op is a kind of operation on the fake.
type Op string

const (
	// OpRead is vfio.FS.ReadFile.
	OpRead Op = "read"
	// OpWrite is vfio.FS.WriteFile.
	OpWrite Op = "write"
	// OpReadlink is vfio.FS.Readlink.
	OpReadlink Op = "readlink"
	// OpReadDir is vfio.FS.ReadDir.
	OpReadDir Op = "readdir"
	// OpExists is vfio.FS.Exists.
	OpExists Op = "stat"
	// OpLoadModule is Load; a fault's Path is the module name.
	OpLoadModule Op = "modprobe"
	// OpHolders is Holders; a fault's Path is the bus ID.
	OpHolders Op = "holders"
)

// Fault makes matching operations fail with Err instead of taking effect.
type Fault struct {
	// Op is the operation that fails.
	Op Op
	// Path is the sysfs path relative to the root
	// ("bus/pci/drivers/vfio-pci/bind"), the module name or the bus ID;
	// "" matches every one.
	Path string
	// Err is what the operation returns; sysfs operations wrap it in an
	// *fs.PathError, as the os package does. Use an errno such as
	// syscall.EIO.
	Err error
	// Drop, for a write or a module load, reports success but leaves the
	// kernel's state alone, as a driver that declines a device in its probe
	// does with drivers_probe, or a module whose driver has another name.
	// Err is ignored then.
	Drop bool
	// Block, for a write, holds the write until the channel is closed and
	// then lets it take effect, as an unbind waits in the kernel for the
	// device's last user. Err is ignored then.
	Block <-chan struct{}
	// Skip lets this many matching operations succeed first.
	Skip int
	// Times is how many operations fail before the fault wears off; 0
	// means every one.
	Times int

	hits int
}

// ErrCrashed is what every operation returns after the simulated crash,
// until Restart.
var ErrCrashed = errors.New("fake sysfs: the process using it has crashed")

// InjectFault adds a fault. Faults are checked in the order added.
func (s *Sysfs) InjectFault(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &f)
}

// ClearFaults removes every fault.
func (s *Sysfs) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

// CrashAfterWrites simulates the crash of the process using the fake once
// n more writes have taken effect: from then on every operation fails with
// ErrCrashed, so whatever the process would have done next (a rollback
// included) never happens. Restart ends it.
func (s *Sysfs) CrashAfterWrites(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.crashAfter, s.crashed = n, n == 0
}

// Restart ends a simulated crash, as a restarted process sees the kernel's
// state as the crash left it.
func (s *Sysfs) Restart() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.crashAfter, s.crashed = -1, false
}

// Writes returns how many writes have taken effect so far.
func (s *Sysfs) Writes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes
}

// OnWrite registers fn to be called, without the fake's lock, after every
// write that takes effect, with its path; tests cancel contexts from it.
func (s *Sysfs) OnWrite(fn func(name string)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onWrite = append(s.onWrite, fn)
}

// crashFault is the fault every operation meets after the crash.
var crashFault = &Fault{Err: ErrCrashed}

// fault returns the fault that applies to an operation, nil when none,
// counting the operation against every fault it matches on the way.
func (s *Sysfs) fault(op Op, path string) *Fault {
	if s.crashed {
		return crashFault
	}
	for _, f := range s.faults {
		if f.Op != op || f.Path != "" && f.Path != path {
			continue
		}
		f.hits++
		if f.hits <= f.Skip || f.Times > 0 && f.hits > f.Skip+f.Times {
			continue
		}
		return f
	}
	return nil
}

// failure returns the error of an operation other than a write, nil when
// it may go on.
func (s *Sysfs) failure(op Op, path string) error {
	if f := s.fault(op, path); f != nil && !f.Drop && f.Block == nil {
		return f.Err
	}
	return nil
}

// wrote counts a write that took effect and starts the crash when due.
func (s *Sysfs) wrote() {
	s.writes++
	if s.crashAfter > 0 {
		s.crashAfter--
		s.crashed = s.crashAfter == 0
	}
}

func (s *Sysfs) pathError(op Op, name string, err error) error {
	if err == ErrCrashed {
		return err
	}
	return &fs.PathError{Op: string(op), Path: s.root + "/" + name, Err: err}
}
