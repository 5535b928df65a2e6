// Package mpsfake is a fake nvidia-cuda-mps-control for tests and the local
// cluster, built into the program that uses it: [Main] runs it when the
// program is executed through a symlink of that name ([Install] makes the
// symlinks). It does
// what NVIDIA documents, for real: -d forks a daemon into the background
// (same command line, a session of its own) that takes a lock in the pipe
// directory, listens on <pipe>/control, writes
// <pipe>/nvidia-cuda-mps-control.pid and logs to <log>/control.log; run
// without arguments it is a client that sends each stdin line to the daemon
// and prints the answer. start_server spawns a real child process named
// nvidia-cuda-mps-server. The daemon records what it was told in
// <log>/fake-record.json; every -d invocation appends a line to
// <log>/fake-launches.
//
// Knobs (environment of the daemon): FAKE_MPS_IGNORE_QUIT answers quit but
// keeps running; FAKE_MPS_IGNORE_LIMITS accepts limit commands without
// applying them; FAKE_MPS_FAIL_START_IF=<path> makes the daemon fail at
// start while <path> exists.
//
// Like the real daemon, the fake runs until it is told to quit or killed:
// removing its pid file or its directories does not end it (it keeps its
// listening socket open, though clients can no longer reach it by path). A test finds the fakes it
// started with [Procs] and ends them with [Kill]; the cleanup of [SetUp]
// kills every fake left. As a last resort, for a test binary killed before
// its cleanup ran, every fake process exits after a maximum lifetime (3
// minutes, or $GPUDRA_FAKE_MPS_MAX_LIFETIME as a Go duration, 0 for none),
// far longer than any test needs a daemon.
package mpsfake

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpudra/gpudra/internal/fakeprog"
	"github.com/gpudra/gpudra/pkg/mps"
	"github.com/gpudra/gpudra/pkg/proctable"
)

// Names of the fake programs, and the files the fake daemon writes to its
// log directory.
const (
	// ControlName is the control binary's name.
	ControlName = "nvidia-cuda-mps-control"
	// ServerName is the name of the server processes start_server spawns.
	ServerName = mps.ServerBinaryName
	// SleeperName is an unrelated long-running program, for tests of PID
	// reuse.
	SleeperName = "gpudra-test-sleeper"

	// RecordName is the JSON [Record] of what the daemon was told.
	RecordName = "fake-record.json"
	// LaunchesName gets one line per -d invocation.
	LaunchesName = "fake-launches"
)

// Knobs, set in the daemon's environment.
const (
	// EnvIgnoreQuit makes the daemon answer quit but keep running ("1").
	EnvIgnoreQuit = "FAKE_MPS_IGNORE_QUIT"
	// EnvIgnoreLimits makes it accept limit commands without applying
	// them ("1").
	EnvIgnoreLimits = "FAKE_MPS_IGNORE_LIMITS"
	// EnvFailStartIf=<path> makes it fail at start while <path> exists.
	EnvFailStartIf = "FAKE_MPS_FAIL_START_IF"
	// EnvMaxLifetime bounds how long a fake process lives (a Go duration;
	// 0 for no bound).
	EnvMaxLifetime = "GPUDRA_FAKE_MPS_MAX_LIFETIME"

	envBackground      = "FAKE_MPS_BACKGROUND"
	defaultMaxLifetime = 3 * time.Minute
)

// Main runs the fake program named by the base name of os.Args[0], if it
// is one of the fakes, and returns its exit code with ok true; otherwise
// it returns ok false and the caller goes on as itself. Call it first in
// main or TestMain.
func Main() (code int, ok bool) {
	switch filepath.Base(os.Args[0]) {
	case ControlName:
		return control(os.Args[1:]), true
	case ServerName, SleeperName:
		return linger(), true
	}
	return 0, false
}

// Install makes dir hold the fake programs: symlinks, under their names,
// to the running executable, which must call [Main] first.
func Install(dir string) error {
	return fakeprog.Install(dir, ControlName, ServerName, SleeperName)
}

// SetUp installs the fake programs in a new temporary directory, for a
// TestMain that called [Main] first, and returns the directory and a
// function that kills every fake process still running from it and removes
// it. Under the race detector every process would sleep a second at exit;
// the fakes are many short processes, so SetUp turns that off for the
// processes the test starts.
func SetUp() (dir string, cleanup func(), err error) {
	dir, err = os.MkdirTemp("", "gpudra-mpsfake")
	if err != nil {
		return "", nil, err
	}
	if err := Install(dir); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	if !strings.Contains(os.Getenv("GORACE"), "atexit_sleep_ms") {
		_ = os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	}
	return dir, func() {
		if err := Kill(Procs(dir)); err != nil {
			fmt.Fprintln(os.Stderr, "mpsfake:", err)
		}
		_ = os.RemoveAll(dir)
	}, nil
}

// Alive reports whether pid is a process that has not exited (a zombie
// has), as tests of the daemons' lifecycle check it.
func Alive(pid int) bool {
	_, ok := proctable.Table{}.Alive(pid)
	return ok
}

// ReadRecord reads what the daemon with log directory logDir was told.
func ReadRecord(logDir string) (Record, error) {
	var r Record
	data, err := os.ReadFile(filepath.Join(logDir, RecordName))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("%s: %w", RecordName, err)
	}
	return r, nil
}

// maxLifetime is how long a fake process may live.
func maxLifetime() time.Duration {
	return fakeprog.MaxLifetime(EnvMaxLifetime, defaultMaxLifetime)
}

// expired reports whether a process born at born has lived too long.
func expired(born time.Time) bool {
	max := maxLifetime()
	return max > 0 && time.Since(born) > max
}

// Record is what the fake daemon was told.
type Record struct {
	PID                    int              `json:"pid"`
	Args                   []string         `json:"args"`
	MultiUser              bool             `json:"multiUser"`
	VisibleDevices         []string         `json:"visibleDevices"`
	ActiveThreadPercentage *float64         `json:"activeThreadPercentage"`
	PinnedMemLimitMiB      map[string]int64 `json:"pinnedMemLimitMiB"`
	Servers                []ServerRecord   `json:"servers"`
	Commands               []string         `json:"commands"`
	servers                map[int]*serverProc
	serverByPID            map[int]*ServerRecord
}

// serverProc is a running server process.
type serverProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// ServerRecord is one server the fake daemon started, with the limits it
// was given.
type ServerRecord struct {
	PID                    int              `json:"pid"`
	UID                    int              `json:"uid"`
	ActiveThreadPercentage *float64         `json:"activeThreadPercentage"`
	PinnedMemLimitMiB      map[string]int64 `json:"pinnedMemLimitMiB"`
}

func control(args []string) int {
	pipe, logDir := os.Getenv(mps.EnvPipeDirectory), os.Getenv(mps.EnvLogDirectory)
	if pipe == "" {
		fmt.Println("CUDA_MPS_PIPE_DIRECTORY must be set to start or to communicate with MPS control daemon")
		return 1
	}
	if len(args) == 0 {
		return client(pipe)
	}
	for _, a := range args {
		if a != "-d" && a != "-M" {
			fmt.Printf("Unknown option: %s\n", a)
			return 1
		}
	}
	if !slices.Contains(args, "-d") {
		fmt.Println("the fake only starts daemons with -d")
		return 1
	}
	if logDir == "" {
		fmt.Println("the fake needs CUDA_MPS_LOG_DIRECTORY")
		return 1
	}
	if os.Getenv(envBackground) == "1" {
		return daemon(pipe, logDir, args)
	}
	appendLine(filepath.Join(logDir, LaunchesName), strings.Join(args, " "))
	// Like the real -d: fork the daemon into the background and return.
	// The child keeps the command line, so /proc shows "... -d".
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), envBackground+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		fmt.Println("fork:", err)
		return 1
	}
	return 0
}

func client(pipe string) int {
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		conn, err := net.Dial("unix", filepath.Join(pipe, mps.ControlSocketName))
		if err != nil {
			fmt.Println("Cannot find MPS control daemon process")
			return 1
		}
		_, _ = fmt.Fprintln(conn, line)
		_ = conn.(*net.UnixConn).CloseWrite()
		_, _ = io.Copy(os.Stdout, conn)
		_ = conn.Close()
	}
	return 0
}

func daemon(pipe, logDir string, args []string) int {
	logf := func(format string, a ...any) {
		appendLine(filepath.Join(logDir, mps.ControlLogName),
			fmt.Sprintf("[%s Control %6d] ", time.Now().Format("2006-01-02 15:04:05.000"), os.Getpid())+fmt.Sprintf(format, a...))
	}
	lock, err := os.OpenFile(filepath.Join(pipe, "control_lock"), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		logf("open lock: %v", err)
		return 1
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		logf("An instance of this daemon is already running with this pipe directory")
		return 1
	}
	if p := os.Getenv(EnvFailStartIf); p != "" {
		if _, err := os.Stat(p); err == nil {
			logf("Failed to start control daemon: device init error (test)")
			return 1
		}
	}
	sock := filepath.Join(pipe, mps.ControlSocketName)
	_ = os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		logf("listen: %v", err)
		return 1
	}
	d := &Record{
		PID:               os.Getpid(),
		Args:              args,
		MultiUser:         slices.Contains(args, "-M"),
		VisibleDevices:    strings.Split(os.Getenv(mps.EnvVisibleDevices), ","),
		PinnedMemLimitMiB: map[string]int64{},
		servers:           map[int]*serverProc{},
		serverByPID:       map[int]*ServerRecord{},
	}
	var mu sync.Mutex
	save := func() {
		d.Servers = d.Servers[:0]
		for _, pid := range slices.Sorted(maps.Keys(d.serverByPID)) {
			d.Servers = append(d.Servers, *d.serverByPID[pid])
		}
		data, _ := json.MarshalIndent(d, "", "  ")
		writeAtomic(filepath.Join(logDir, RecordName), data)
	}
	mu.Lock()
	save()
	mu.Unlock()
	writeAtomic(filepath.Join(pipe, mps.PIDFileName), []byte(strconv.Itoa(os.Getpid())+"\n"))
	logf("Starting control daemon using socket %s", sock)
	logf("To connect CUDA applications to this daemon, set env CUDA_MPS_PIPE_DIRECTORY=%s", pipe)

	stopServers := func() {
		for pid, p := range d.servers {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
			}
			delete(d.servers, pid)
			delete(d.serverByPID, pid)
		}
	}
	// The real daemon runs until quit or killed, whatever happens to its
	// directories; only the fake's last-resort lifetime ends it otherwise.
	go func() {
		born := time.Now()
		for range time.Tick(100 * time.Millisecond) {
			if expired(born) {
				mu.Lock()
				stopServers()
				os.Exit(0)
			}
		}
	}()

	for {
		conn, err := ln.Accept()
		if err != nil {
			logf("accept: %v", err)
			return 1
		}
		line, _ := bufio.NewReader(conn).ReadString('\n')
		line = strings.TrimSpace(line)
		mu.Lock()
		logf("Cmd:%s", line)
		d.Commands = append(d.Commands, line)
		reply, quit := d.handle(line, stopServers, &mu, save)
		save()
		mu.Unlock()
		if reply != "" {
			_, _ = fmt.Fprintln(conn, reply)
		}
		_ = conn.Close()
		if quit {
			_ = os.Remove(filepath.Join(pipe, mps.PIDFileName))
			_ = os.Remove(sock)
			logf("Exit")
			return 0
		}
	}
}

var memValue = regexp.MustCompile(`^([0-9]+)([MG])$`)

// handle runs one command; mu is held.
func (d *Record) handle(line string, stopServers func(), mu *sync.Mutex, save func()) (reply string, quit bool) {
	f := strings.Fields(line)
	if len(f) == 0 {
		return "", false
	}
	ignoreLimits := os.Getenv(EnvIgnoreLimits) == "1"
	switch {
	case f[0] == "quit" && len(f) == 1:
		if os.Getenv(EnvIgnoreQuit) == "1" {
			return "", false
		}
		stopServers()
		return "", true
	case f[0] == "get_server_list" && len(f) == 1:
		var pids []string
		for _, pid := range slices.Sorted(maps.Keys(d.serverByPID)) {
			pids = append(pids, strconv.Itoa(pid))
		}
		return strings.Join(pids, "\n"), false
	case f[0] == "start_server" && len(f) == 3 && f[1] == "-uid":
		uid, err := strconv.Atoi(f[2])
		if err != nil {
			return "Invalid user id " + f[2], false
		}
		for _, s := range d.serverByPID {
			if s.UID != uid && !d.MultiUser {
				return fmt.Sprintf("A server for user %d is running: user %d must wait for it to exit", s.UID, uid), false
			}
		}
		cmd := exec.Command(filepath.Join(filepath.Dir(os.Args[0]), ServerName))
		if err := cmd.Start(); err != nil {
			return "start server: " + err.Error(), false
		}
		pid := cmd.Process.Pid
		p := &serverProc{cmd: cmd, done: make(chan struct{})}
		d.servers[pid] = p
		d.serverByPID[pid] = &ServerRecord{PID: pid, UID: uid, ActiveThreadPercentage: clonePtr(d.ActiveThreadPercentage), PinnedMemLimitMiB: maps.Clone(d.PinnedMemLimitMiB)}
		go func() {
			_ = cmd.Wait()
			close(p.done)
			mu.Lock()
			if d.servers[pid] == p {
				delete(d.servers, pid)
				delete(d.serverByPID, pid)
				save()
			}
			mu.Unlock()
		}()
		return "", false
	case f[0] == "set_default_active_thread_percentage" && len(f) == 2:
		p, err := strconv.ParseFloat(f[1], 64)
		if err != nil || p <= 0 || p > 100 {
			return "Invalid percentage " + f[1], false
		}
		if !ignoreLimits {
			d.ActiveThreadPercentage = &p
		}
		return "", false
	case f[0] == "get_default_active_thread_percentage" && len(f) == 1:
		return showPct(d.ActiveThreadPercentage), false
	case f[0] == "set_default_device_pinned_mem_limit" && len(f) == 3:
		dev, ok := d.device(f[1])
		mib, vok := parseMem(f[2])
		if !ok || !vok {
			return fmt.Sprintf("Invalid device or value: %s %s", f[1], f[2]), false
		}
		if !ignoreLimits {
			d.PinnedMemLimitMiB[dev] = mib
		}
		return "", false
	case f[0] == "get_default_device_pinned_mem_limit" && len(f) == 2:
		dev, ok := d.device(f[1])
		if !ok {
			return "Invalid device " + f[1], false
		}
		return showMem(d.PinnedMemLimitMiB[dev]), false
	case f[0] == "set_active_thread_percentage" && len(f) == 3:
		s, ok := d.server(f[1])
		p, err := strconv.ParseFloat(f[2], 64)
		if !ok || err != nil || p <= 0 || p > 100 {
			return fmt.Sprintf("Invalid server or percentage: %s %s", f[1], f[2]), false
		}
		if !ignoreLimits {
			s.ActiveThreadPercentage = &p
		}
		return "", false
	case f[0] == "set_device_pinned_mem_limit" && len(f) == 4:
		s, ok := d.server(f[1])
		dev, dok := d.device(f[2])
		mib, vok := parseMem(f[3])
		if !ok || !dok || !vok {
			return fmt.Sprintf("Invalid server, device or value: %s %s %s", f[1], f[2], f[3]), false
		}
		if !ignoreLimits {
			s.PinnedMemLimitMiB[dev] = mib
		}
		return "", false
	}
	return "Unknown command: " + line, false
}

// device resolves a device given by UUID or by index among the visible
// devices.
func (d *Record) device(s string) (string, bool) {
	if i, err := strconv.Atoi(s); err == nil {
		if i >= 0 && i < len(d.VisibleDevices) {
			return d.VisibleDevices[i], true
		}
		return "", false
	}
	return s, slices.Contains(d.VisibleDevices, s)
}

func (d *Record) server(s string) (*ServerRecord, bool) {
	pid, err := strconv.Atoi(s)
	if err != nil {
		return nil, false
	}
	r, ok := d.serverByPID[pid]
	return r, ok
}

func parseMem(s string) (int64, bool) {
	m := memValue.FindStringSubmatch(s)
	if m == nil {
		return 0, false
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	if m[2] == "G" {
		n *= 1024
	}
	return n, n > 0
}

// showMem answers like a real driver was seen to: whole G, rounded down,
// from 1 GiB up.
func showMem(mib int64) string {
	if mib >= 1024 {
		return fmt.Sprintf("%dG", mib/1024)
	}
	return fmt.Sprintf("%dM", mib)
}

func showPct(p *float64) string {
	if p == nil {
		return "100.0"
	}
	return strconv.FormatFloat(*p, 'f', 1, 64)
}

// linger is a process that waits to be killed: an MPS server, or an
// unrelated program. It exits by itself on SIGTERM or when its lifetime is
// over; like a real server, not when its pipe directory disappears.
func linger() int {
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	born := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-term:
			return 0
		case <-tick.C:
			if expired(born) {
				return 0
			}
		}
	}
}

func appendLine(path, line string) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	_, _ = fmt.Fprintln(f, line)
	_ = f.Close()
}

func writeAtomic(path string, data []byte) {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err == nil {
		_ = os.Rename(tmp, path)
	}
}

func clonePtr(p *float64) *float64 {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// RunTests is a test binary's TestMain body for tests of the fake daemon's
// users: it runs as the fake when started as one, else installs the fakes,
// stores their directory in *dir, runs the tests and removes the fakes. It
// returns the exit code.
func RunTests(m interface{ Run() int }, dir *string) int {
	if code, ok := Main(); ok {
		return code
	}
	d, cleanup, err := SetUp()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	*dir = d
	defer cleanup()
	return m.Run()
}
