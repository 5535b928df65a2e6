package pluginflags

import (
	"context"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestIMEXFlagErrors(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "defaults", args: nil},
		{name: "off ignores the rest", args: []string{"--imex-daemon=off", "--imex-port=0"}},
		{name: "unknown mode", args: []string{"--imex-daemon=maybe"}, wantErr: `--imex-daemon "maybe": must be auto, required or off`},
		{name: "unknown launcher", args: []string{"--imex-launcher=docker"}, wantErr: `--imex-launcher "docker": must be process or systemd-run`},
		{name: "relative systemd-run", args: []string{"--imex-launcher=systemd-run", "--imex-systemd-run-path=systemd-run"}, wantErr: "--imex-systemd-run-path"},
		{name: "port", args: []string{"--imex-port=70000"}, wantErr: "--imex-port 70000: must be 1..65535"},
		{name: "same ports", args: []string{"--imex-cmd-port=50000"}, wantErr: "--imex-cmd-port 50000: must be 1..65535 and differ from --imex-port"},
		{name: "max nodes", args: []string{"--imex-max-nodes=0"}, wantErr: "--imex-max-nodes 0: must be 1..256"},
		{name: "relative dir", args: []string{"--imex-dir=imex"}, wantErr: `--imex-dir "imex": must be an absolute path`},
		{name: "relative hosts", args: []string{"--imex-hosts-file=hosts"}, wantErr: `--imex-hosts-file "hosts"`},
		{name: "required needs a namespace", args: []string{"--imex-daemon=required", "--clique-namespace=", "--node-ip=10.0.0.1"}, wantErr: "--clique-namespace"},
		{name: "required needs an IP", args: []string{"--imex-daemon=required", "--clique-namespace=gpudra", "--node-ip=node-1"}, wantErr: `--node-ip "node-1"`},
		{name: "required with both", args: []string{"--imex-daemon=required", "--clique-namespace=gpudra", "--node-ip=10.0.0.1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var f IMEXFlags
			fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
			f.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := f.Validate()
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

func TestIMEXFlagsWithoutBinary(t *testing.T) {
	for _, tc := range []struct {
		mode    string
		wantErr bool
	}{{IMEXDaemonAuto, false}, {IMEXDaemonRequired, true}, {IMEXDaemonOff, false}} {
		f := IMEXFlags{Daemon: tc.mode, Binary: "/nonexistent/nvidia-imex", CliqueNamespace: "gpudra", NodeIP: "10.0.0.1"}
		d, err := f.NodeDaemon(context.Background(), nil, nil, "node", t.TempDir())
		if d != nil || (err != nil) != tc.wantErr {
			t.Errorf("%s without the binary: daemon %v, err %v; want none, error %v", tc.mode, d, err, tc.wantErr)
		}
	}
}
