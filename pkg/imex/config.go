package imex

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
)

// Program names, and the files of the daemon's directory.
const (
	// DaemonName is the IMEX daemon's program.
	DaemonName = "nvidia-imex"
	// CtlName is its query tool.
	CtlName = "nvidia-imex-ctl"
	// ConfigName is the daemon's config file in [Config.Dir].
	ConfigName = "imexd.cfg"
	// NodesConfigName is its peer list in [Config.Dir].
	NodesConfigName = "nodes.cfg"
	// LogName is the daemon's log in [Config.Dir].
	LogName = "imexd.log"
	// LaunchOutName gets the output of the command that started it.
	LaunchOutName = "launch.out"
)

// Defaults of [Config].
const (
	// DefaultServerPort is nvidia-imex's default SERVER_PORT.
	DefaultServerPort = 50000
	// DefaultCmdPort is nvidia-imex's default IMEX_CMD_PORT.
	DefaultCmdPort = 50005
	// DefaultMaxNodes is the peer names written: the nodes of one NVL72
	// rack.
	DefaultMaxNodes = 18
	// MaxNodesLimit bounds MaxNodes: the largest clique NVIDIA documents
	// is an NVL576 (144 nodes of 4 GPUs); 256 leaves room.
	MaxNodesLimit = 256
)

// The config keys gpudra writes: the names nvidia-imex reads.
const (
	KeyLogFile        = "LOG_FILE_NAME"
	KeyLogLevel       = "LOG_LEVEL"
	KeyBindIP         = "BIND_INTERFACE_IP"
	KeyServerPort     = "SERVER_PORT"
	KeyNodeConfigFile = "IMEX_NODE_CONFIG_FILE"
	KeyWaitForQuorum  = "IMEX_WAIT_FOR_QUORUM"
	KeyCmdEnabled     = "IMEX_CMD_ENABLED"
	KeyCmdBindIP      = "IMEX_CMD_BIND_INTERFACE_IP"
	KeyCmdPort        = "IMEX_CMD_PORT"
	KeyDaemonize      = "DAEMONIZE"
)

// PeerName is the DNS name of the IMEX peer with the given clique index.
func PeerName(index int) string { return fmt.Sprintf("compute-domain-daemon-%04d", index) }

// Config is what the node's daemon runs with.
type Config struct {
	// Dir holds the config, the peer list and the log; the daemon is
	// found in /proc by its config path in it.
	Dir string
	// NodeIP is the address the daemon serves peers on; empty binds every
	// interface.
	NodeIP string
	// ServerPort is the peers' port (SERVER_PORT).
	ServerPort int
	// CmdPort is the query service's port (IMEX_CMD_PORT), on loopback.
	CmdPort int
	// MaxNodes is how many peer names the peer list holds: indices
	// 0..MaxNodes-1 of the clique.
	MaxNodes int
}

// Path returns the path of the config file.
func (c Config) Path() string { return filepath.Join(c.Dir, ConfigName) }

// NodesPath returns the path of the peer list.
func (c Config) NodesPath() string { return filepath.Join(c.Dir, NodesConfigName) }

// LogPath returns the path of the daemon's log.
func (c Config) LogPath() string { return filepath.Join(c.Dir, LogName) }

// Validate names the field and the allowed values of every bad setting.
func (c Config) Validate() error {
	switch {
	case c.Dir == "" || !filepath.IsAbs(c.Dir):
		return fmt.Errorf("IMEX directory %q: must be an absolute path", c.Dir)
	case c.NodeIP != "" && net.ParseIP(c.NodeIP) == nil:
		return fmt.Errorf("node IP %q: not an IP address", c.NodeIP)
	case c.ServerPort < 1 || c.ServerPort > 65535:
		return fmt.Errorf("IMEX server port %d: must be 1..65535", c.ServerPort)
	case c.CmdPort < 1 || c.CmdPort > 65535:
		return fmt.Errorf("IMEX command port %d: must be 1..65535", c.CmdPort)
	case c.CmdPort == c.ServerPort:
		return fmt.Errorf("IMEX command port %d: must differ from the server port", c.CmdPort)
	case c.MaxNodes < 1 || c.MaxNodes > MaxNodesLimit:
		return fmt.Errorf("IMEX max nodes %d: must be 1..%d", c.MaxNodes, MaxNodesLimit)
	}
	return nil
}

// Render returns the config file. The daemon forks into the background
// (DAEMONIZE=1), so that the process launcher and a forking systemd unit
// treat it alike; it does not wait for a quorum of peers, so the local
// daemon is ready as soon as it runs and Prepare does not wait for the
// other nodes of a domain.
func (c Config) Render() []byte {
	var b bytes.Buffer
	b.WriteString("# Written by gpudra (compute-domain-kubelet-plugin); read by nvidia-imex at start only.\n")
	kv := func(k, v string) { fmt.Fprintf(&b, "%s=%s\n", k, v) }
	kv(KeyLogFile, c.LogPath())
	kv(KeyLogLevel, "4")
	kv(KeyBindIP, c.NodeIP)
	kv(KeyServerPort, strconv.Itoa(c.ServerPort))
	kv(KeyNodeConfigFile, c.NodesPath())
	kv(KeyWaitForQuorum, "NONE")
	kv(KeyCmdEnabled, "1")
	kv(KeyCmdBindIP, "127.0.0.1")
	kv(KeyCmdPort, strconv.Itoa(c.CmdPort))
	kv(KeyDaemonize, "1")
	return b.Bytes()
}

// NodesConfig returns the peer list: one DNS name per clique index. It
// never changes while MaxNodes does not, so a peer joining or leaving only
// changes what the names resolve to.
func (c Config) NodesConfig() []byte {
	var b bytes.Buffer
	for i := range c.MaxNodes {
		b.WriteString(PeerName(i))
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// ParseConfig reads KEY=VALUE lines as nvidia-imex does: '#' starts a
// comment line, blanks around keys and values are dropped.
func ParseConfig(data []byte) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		out[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return out
}
