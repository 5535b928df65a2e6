package imex_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/imex"
)

func TestConfigValidate(t *testing.T) {
	good := imex.Config{Dir: "/var/lib/gpudra/imex", NodeIP: "10.0.0.1", ServerPort: 50000, CmdPort: 50005, MaxNodes: 18}
	tests := []struct {
		name    string
		change  func(*imex.Config)
		wantErr string
	}{
		{name: "good", change: func(*imex.Config) {}},
		{name: "no node IP binds all", change: func(c *imex.Config) { c.NodeIP = "" }},
		{name: "relative dir", change: func(c *imex.Config) { c.Dir = "imex" }, wantErr: "must be an absolute path"},
		{name: "bad IP", change: func(c *imex.Config) { c.NodeIP = "node-1" }, wantErr: `node IP "node-1": not an IP address`},
		{name: "port zero", change: func(c *imex.Config) { c.ServerPort = 0 }, wantErr: "server port 0: must be 1..65535"},
		{name: "cmd port high", change: func(c *imex.Config) { c.CmdPort = 70000 }, wantErr: "command port 70000: must be 1..65535"},
		{name: "same ports", change: func(c *imex.Config) { c.CmdPort = 50000 }, wantErr: "must differ from the server port"},
		{name: "no nodes", change: func(c *imex.Config) { c.MaxNodes = 0 }, wantErr: "max nodes 0: must be 1..256"},
		{name: "too many nodes", change: func(c *imex.Config) { c.MaxNodes = 257 }, wantErr: "max nodes 257: must be 1..256"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := good
			tc.change(&c)
			err := c.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestConfigRender(t *testing.T) {
	c := imex.Config{Dir: "/d", NodeIP: "10.0.0.1", ServerPort: 50000, CmdPort: 50005, MaxNodes: 3}
	got := imex.ParseConfig(c.Render())
	want := map[string]string{
		imex.KeyNodeConfigFile: "/d/nodes.cfg",
		imex.KeyServerPort:     "50000",
		imex.KeyCmdPort:        "50005",
		imex.KeyCmdEnabled:     "1",
		imex.KeyBindIP:         "10.0.0.1",
		imex.KeyLogFile:        "/d/imexd.log",
		imex.KeyDaemonize:      "1",
		imex.KeyWaitForQuorum:  "NONE",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if nodes := string(c.NodesConfig()); nodes != "compute-domain-daemon-0000\ncompute-domain-daemon-0001\ncompute-domain-daemon-0002\n" {
		t.Errorf("nodes config = %q", nodes)
	}
}

func TestHostsFileBlock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hosts")
	if err := os.WriteFile(path, []byte("127.0.0.1\tlocalhost\n10.0.0.9 other"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := imex.HostsFile{Path: path}
	steps := []struct {
		name        string
		peers       map[int]string
		wantChanged bool
		wantPeers   map[string]string
	}{
		{name: "first block", peers: map[int]string{0: "10.0.0.1", 2: "10.0.0.3"}, wantChanged: true,
			wantPeers: map[string]string{"compute-domain-daemon-0000": "10.0.0.1", "compute-domain-daemon-0002": "10.0.0.3"}},
		{name: "same peers", peers: map[int]string{2: "10.0.0.3", 0: "10.0.0.1"}, wantChanged: false,
			wantPeers: map[string]string{"compute-domain-daemon-0000": "10.0.0.1", "compute-domain-daemon-0002": "10.0.0.3"}},
		{name: "a peer joins", peers: map[int]string{0: "10.0.0.1", 1: "10.0.0.2", 2: "10.0.0.3"}, wantChanged: true,
			wantPeers: map[string]string{"compute-domain-daemon-0000": "10.0.0.1", "compute-domain-daemon-0001": "10.0.0.2", "compute-domain-daemon-0002": "10.0.0.3"}},
		{name: "all leave", peers: nil, wantChanged: true, wantPeers: map[string]string{}},
	}
	for _, s := range steps {
		changed, err := h.Write(s.peers)
		if err != nil || changed != s.wantChanged {
			t.Fatalf("%s: Write = %v, %v; want changed %v", s.name, changed, err, s.wantChanged)
		}
		got, err := h.Peers()
		if err != nil || len(got) != len(s.wantPeers) {
			t.Fatalf("%s: Peers = %v, %v; want %v", s.name, got, err, s.wantPeers)
		}
		for k, v := range s.wantPeers {
			if got[k] != v {
				t.Errorf("%s: %s = %q, want %q", s.name, k, got[k], v)
			}
		}
		data, _ := os.ReadFile(path)
		if !strings.HasPrefix(string(data), "127.0.0.1\tlocalhost\n10.0.0.9 other\n") || strings.Count(string(data), imex.HostsBegin) != 1 {
			t.Fatalf("%s: the lines outside the block changed or the block repeats:\n%s", s.name, data)
		}
	}
	if _, err := h.Write(map[int]string{0: "not-an-ip"}); err == nil || !strings.Contains(err.Error(), `peer 0 has IP "not-an-ip"`) {
		t.Errorf("bad IP: %v", err)
	}
}
