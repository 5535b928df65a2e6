package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/gpudra/gpudra/internal/shorttemp"
)

// newCommandForTest is the root command, with the logging configuration
// that an earlier command of the test binary applied reset.
func newCommandForTest(t *testing.T) *cobra.Command {
	t.Helper()
	if err := logsapi.ResetForTest(nil); err != nil {
		t.Fatal(err)
	}
	return newRootCommand()
}

// listenOn serves a unix socket that accepts and closes connections, as
// a plugin's socket looks to nodemode.
func listenOn(t *testing.T, path string) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
}

// TestDevicePluginRefusesBadInput: each mistake is refused at start with
// the flag or config field named.
func TestDevicePluginRefusesBadInput(t *testing.T) {
	dir := shorttemp.Dir(t)
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	base := []string{"device-plugin", "--fleet", "dgx-h100", "--node-name", "dgx-h100-0", "--device-plugin-dir", filepath.Join(dir, "dp"), "--cdi-dir", filepath.Join(dir, "cdi"), "--dra-plugin-data-dir", filepath.Join(dir, "dra")}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown strategy", []string{"--mig-strategy", "some"}, `--mig-strategy "some": must be one of none, single, mixed`},
		{"unknown strategy in the file", []string{"--config-file", write("s.yaml", "version: v1\nflags: {migStrategy: some}\n")}, `flags.migStrategy "some"`},
		{"zero replicas", []string{"--config-file", write("r.yaml", "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 0}]}}\n")}, "sharing.timeSlicing.resources[0].replicas 0: must be at least 1"},
		{"GPUs that do not exist", []string{"--config-file", write("g.yaml", "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, rename: nvidia.com/gpu-shared, replicas: 2, devices: [0, 12]}]}}\n")}, `sharing.timeSlicing.resources[0].devices: "12" names no device of this node's 8`},
		{"list strategy", []string{"--device-list-strategy", "volume-mounts"}, `--device-list-strategy "volume-mounts": must be any of envvar, cdi-cri, cdi-annotations`},
		{"single on GPUs without MIG is fine, with a missing file not", []string{"--config-file", filepath.Join(dir, "missing.yaml")}, "--config-file: open"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := newCommandForTest(t)
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SetArgs(append(append([]string{}, base...), tc.args...))
			if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}

	// A DRA plugin serving the node: the device plugin does not start.
	if err := os.MkdirAll(filepath.Join(dir, "dra"), 0o755); err != nil {
		t.Fatal(err)
	}
	listenOn(t, filepath.Join(dir, "dra", "dra.sock"))
	cmd := newCommandForTest(t)
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs(base)
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "a DRA kubelet plugin of gpu.nvidia.com serves this node") {
		t.Errorf("with a DRA plugin listening: %v", err)
	}
}

// TestKubeletPluginRefusesWhileADevicePluginServes: NVIDIA's device
// plugin's socket in the kubelet's device-plugin directory keeps the DRA
// plugin from starting.
func TestKubeletPluginRefusesWhileADevicePluginServes(t *testing.T) {
	dir := shorttemp.Dir(t)
	listenOn(t, filepath.Join(dir, "nvidia-gpu.sock"))
	cmd := newCommandForTest(t)
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"kubelet-plugin", "--fleet", "dgx-h100", "--node-name", "dgx-h100-0", "--device-plugin-dir", dir,
		"--plugin-data-dir", filepath.Join(dir, "plugin"), "--registrar-dir", filepath.Join(dir, "reg"), "--cdi-dir", filepath.Join(dir, "cdi"), "--kubeconfig", filepath.Join(dir, "none")})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "nvidia-gpu.sock") || !strings.Contains(err.Error(), "never both") {
		t.Errorf("got %v, want a refusal naming NVIDIA's socket", err)
	}
}
