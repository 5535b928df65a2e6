// Package imexfake is a fake nvidia-imex and nvidia-imex-ctl for tests and
// the local cluster, built into the program that uses it the way
// internal/mpsfake fakes the MPS control daemon: [Main] runs it when the
// program is executed through a symlink of that name ([Install] makes
// them, through internal/fakeprog).
//
// It keeps the real daemon's failure behaviour: nvidia-imex -c <config>
// reads its config and the peer list it names only at start, and fails
// (exit 1, a line in its log or on stderr) without a readable config or
// peer list, or when its server or command port is taken. With DAEMONIZE=1
// it forks the daemon into the background (same command line, a session of
// its own) and returns. The daemon runs until SIGTERM or SIGKILL: removing
// its directory does not end it. On SIGUSR1 it resolves its peers' names
// again through the hosts file named by $GPUDRA_FAKE_IMEX_HOSTS_FILE (the
// real one uses the system resolver), and records the result in
// fake-imex-record.json beside its log.
//
// nvidia-imex-ctl -c <config> -q connects to the command port of the
// config and prints what the daemon answers: READY, or NOT_READY while
// the file named by $FAKE_IMEX_NOT_READY_IF (the daemon's environment)
// exists.
//
// As a last resort, for a test binary killed before its cleanup ran, a fake
// daemon exits after $GPUDRA_FAKE_IMEX_MAX_LIFETIME (a Go duration, 0 for
// none; 10 minutes by default).
package imexfake

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gpudra/gpudra/internal/fakeprog"
	"github.com/gpudra/gpudra/pkg/imex"
	"github.com/gpudra/gpudra/pkg/proctable"
)

// Names and knobs.
const (
	// RecordName is the daemon's [Record], beside its log.
	RecordName = "fake-imex-record.json"
	// EnvHostsFile names the hosts file the daemon resolves peers with.
	EnvHostsFile = "GPUDRA_FAKE_IMEX_HOSTS_FILE"
	// EnvNotReadyIf=<path> makes the daemon answer NOT_READY while <path>
	// exists.
	EnvNotReadyIf = "FAKE_IMEX_NOT_READY_IF"
	// EnvMaxLifetime bounds a fake daemon's life.
	EnvMaxLifetime = "GPUDRA_FAKE_IMEX_MAX_LIFETIME"

	envBackground      = "FAKE_IMEX_BACKGROUND"
	defaultMaxLifetime = 10 * time.Minute
)

// Main runs the fake named by os.Args[0]'s base name, if it is one, and
// returns its exit code with ok true; otherwise ok is false. Call it first
// in main or TestMain.
func Main() (code int, ok bool) {
	switch filepath.Base(os.Args[0]) {
	case imex.DaemonName:
		return daemonMain(os.Args[1:]), true
	case imex.CtlName:
		return ctlMain(os.Args[1:]), true
	}
	return 0, false
}

// Install makes dir hold the fake nvidia-imex and nvidia-imex-ctl.
func Install(dir string) error { return fakeprog.Install(dir, imex.DaemonName, imex.CtlName) }

// Daemons returns the live fake daemons started from dir.
func Daemons(dir string) []proctable.Ref {
	var out []proctable.Ref
	t := proctable.Table{}
	for _, r := range fakeprog.Procs(dir) {
		if t.IsCommand(r.PID, imex.DaemonName) {
			out = append(out, r)
		}
	}
	return out
}

// Record is what a fake daemon writes about itself.
type Record struct {
	PID int `json:"pid"`
	// Config is the config it read at start.
	Config map[string]string `json:"config"`
	// Names are the peer names of its peer list.
	Names []string `json:"names"`
	// Peers are the names it resolved, to their IPs.
	Peers map[string]string `json:"peers"`
	// Reloads counts SIGUSR1s.
	Reloads int `json:"reloads"`
}

// ReadRecord reads the record of the daemon whose log is in dir.
func ReadRecord(dir string) (Record, error) {
	var r Record
	data, err := os.ReadFile(filepath.Join(dir, RecordName))
	if err != nil {
		return r, err
	}
	return r, json.Unmarshal(data, &r)
}

func daemonMain(args []string) int {
	if len(args) != 2 || args[0] != "-c" {
		fmt.Fprintln(os.Stderr, "usage: nvidia-imex -c <config file>")
		return 1
	}
	data, err := os.ReadFile(args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "failed to read config file %s: %v\n", args[1], err)
		return 1
	}
	cfg := imex.ParseConfig(data)
	nodes, err := os.ReadFile(cfg[imex.KeyNodeConfigFile])
	if err != nil {
		fmt.Fprintf(os.Stderr, "failed to read node config file %q: %v\n", cfg[imex.KeyNodeConfigFile], err)
		return 1
	}
	if cfg[imex.KeyDaemonize] == "1" && os.Getenv(envBackground) != "1" {
		cmd := exec.Command(os.Args[0], args...)
		cmd.Env = append(os.Environ(), envBackground+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, "fork:", err)
			return 1
		}
		return 0
	}
	return runDaemon(cfg, strings.Fields(string(nodes)))
}

func runDaemon(cfg map[string]string, names []string) int {
	logPath := cfg[imex.KeyLogFile]
	logf := func(format string, a ...any) {
		f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return
		}
		fmt.Fprintf(f, "[%s] [%d] %s\n", time.Now().Format("2006-01-02 15:04:05.000"), os.Getpid(), fmt.Sprintf(format, a...))
		_ = f.Close()
	}
	server, err := net.Listen("tcp", net.JoinHostPort(cfg[imex.KeyBindIP], cfg[imex.KeyServerPort]))
	if err != nil {
		logf("IMEX daemon failed to start: server port: %v", err)
		return 1
	}
	defer func() { _ = server.Close() }()
	if cfg[imex.KeyCmdEnabled] != "1" {
		logf("IMEX daemon started without command service")
	}
	cmdAddr := net.JoinHostPort(orLoopback(cfg[imex.KeyCmdBindIP]), cfg[imex.KeyCmdPort])
	cmdLn, err := net.Listen("tcp", cmdAddr)
	if err != nil {
		logf("IMEX daemon failed to start: command port: %v", err)
		return 1
	}
	rec := &Record{PID: os.Getpid(), Config: cfg, Names: names}
	var mu sync.Mutex
	resolve := func() {
		mu.Lock()
		defer mu.Unlock()
		rec.Peers = map[string]string{}
		if path := os.Getenv(EnvHostsFile); path != "" {
			if peers, err := (imex.HostsFile{Path: path}).Peers(); err == nil {
				for _, n := range names {
					if ip, ok := peers[n]; ok {
						rec.Peers[n] = ip
					}
				}
			}
		}
		data, _ := json.MarshalIndent(rec, "", "  ")
		path := filepath.Join(filepath.Dir(logPath), RecordName)
		if os.WriteFile(path+".tmp", data, 0o644) == nil {
			_ = os.Rename(path+".tmp", path)
		}
		logf("peers resolved: %d of %d names", len(rec.Peers), len(names))
	}
	resolve()
	logf("IMEX daemon started: server %s, command service %s, %d peer names", server.Addr(), cmdLn.Addr(), len(names))

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGTERM)
	go func() {
		for {
			c, err := cmdLn.Accept()
			if err != nil {
				return
			}
			go answer(c)
		}
	}()
	go func() {
		for {
			c, err := server.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	lifetime := fakeprog.MaxLifetime(EnvMaxLifetime, defaultMaxLifetime)
	var expire <-chan time.Time
	if lifetime > 0 {
		expire = time.After(lifetime)
	}
	for {
		select {
		case s := <-sigs:
			if s == syscall.SIGTERM {
				logf("SIGTERM: exiting")
				return 0
			}
			mu.Lock()
			rec.Reloads++
			mu.Unlock()
			logf("SIGUSR1: resolving peers again")
			resolve()
		case <-expire:
			logf("fake lifetime over: exiting")
			return 0
		}
	}
}

func answer(c net.Conn) {
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	line, _ := bufio.NewReader(c).ReadString('\n')
	switch strings.TrimSpace(line) {
	case "q":
		if p := os.Getenv(EnvNotReadyIf); p != "" {
			if _, err := os.Stat(p); err == nil {
				fmt.Fprintln(c, "NOT_READY")
				return
			}
		}
		fmt.Fprintln(c, imex.ReadyAnswer)
	default:
		fmt.Fprintln(c, "unknown command")
	}
}

func orLoopback(ip string) string {
	if ip == "" {
		return "127.0.0.1"
	}
	return ip
}

func ctlMain(args []string) int {
	i := slices.Index(args, "-c")
	if i < 0 || i+1 >= len(args) || !slices.Contains(args, "-q") {
		fmt.Fprintln(os.Stderr, "usage: nvidia-imex-ctl -c <config file> -q")
		return 1
	}
	data, err := os.ReadFile(args[i+1])
	if err != nil {
		fmt.Printf("failed to read config file %s: %v\n", args[i+1], err)
		return 1
	}
	cfg := imex.ParseConfig(data)
	if cfg[imex.KeyCmdEnabled] != "1" {
		fmt.Println("the command service is not enabled in the config (IMEX_CMD_ENABLED)")
		return 1
	}
	addr := net.JoinHostPort(orLoopback(cfg[imex.KeyCmdBindIP]), cfg[imex.KeyCmdPort])
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		fmt.Printf("UNAVAILABLE: cannot connect to the IMEX daemon at %s\n", addr)
		return 1
	}
	defer func() { _ = c.Close() }()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintln(c, "q")
	reply, _ := bufio.NewReader(c).ReadString('\n')
	fmt.Println(strings.TrimSpace(reply))
	return 0
}

// RunTests is a test binary's TestMain body: it runs as a fake when
// started as one, else installs the fakes in a new temporary directory,
// stores it in *dir, runs the tests, kills every fake daemon left and
// removes the directory.
func RunTests(m interface{ Run() int }, dir *string) int {
	if code, ok := Main(); ok {
		return code
	}
	d, err := os.MkdirTemp("", "gpudra-imexfake")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer func() { _ = os.RemoveAll(d) }()
	if err := Install(d); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if !strings.Contains(os.Getenv("GORACE"), "atexit_sleep_ms") {
		_ = os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	}
	*dir = d
	code := m.Run()
	if err := fakeprog.Kill(fakeprog.Procs(d)); err != nil {
		fmt.Fprintln(os.Stderr, "imexfake:", err)
	}
	return code
}
