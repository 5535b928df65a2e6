package main

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// -o yaml and -o json are refused while a kubelet plugin listens in its
// directory: applying them would duplicate the node's pool. Without a
// plugin, or for the table, inspect works, and the slices carry the label
// that finds them again.
func TestInspectRefusesSlicesWhileThePluginServes(t *testing.T) {
	dir, err := os.MkdirTemp("", "insp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	run := func(args ...string) (string, error) {
		cmd := newRootCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(append([]string{"inspect", "--fleet", "dgx-h100", "--node", "dgx-h100-0", "--plugin-data-dir", dir}, args...))
		err := cmd.Execute()
		return out.String(), err
	}

	out, err := run("-o", "yaml")
	if err != nil || !strings.Contains(out, "app.kubernetes.io/managed-by: gpudra-inspect") {
		t.Fatalf("no plugin listening: err %v, output without the managed-by label:\n%.400s", err, out)
	}

	ln, err := net.Listen("unix", filepath.Join(dir, "dra.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	for _, format := range []string{"yaml", "json"} {
		_, err := run("-o", format)
		if err == nil || !strings.Contains(err.Error(), "dra.sock") || !strings.Contains(err.Error(), "second copy of every device") {
			t.Errorf("-o %s with a plugin listening: %v; want it refused, naming the socket", format, err)
		}
	}
	if out, err := run(); err != nil || !strings.Contains(out, "gpu-0") {
		t.Errorf("the table with a plugin listening: %v\n%s", err, out)
	}
}

// The table shows how a shared node shares its GPUs.
func TestInspectTableShowsSharing(t *testing.T) {
	cmd := newRootCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"inspect", "--fleet", "dgx-h100", "--node", "dgx-h100-0", "--vfio", "off", "--consumable-shares", "4"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	// HEALTH: the simulated GPUs' conditions, read once through NVML.
	for _, want := range []string{"SHARING", "shares=4", "8 GPU(s) shared (shares=4): a claim that asks for no capacity gets the whole GPU", "HEALTH", "  ok  "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table does not show %q:\n%s", want, out.String())
		}
	}
}
