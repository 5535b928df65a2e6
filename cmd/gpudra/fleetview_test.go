package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFleetViewErrors: a kubeconfig that cannot be read and an address
// that cannot be listened on are refused, naming the flag.
func TestFleetViewErrors(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	// A kubeconfig for a server nobody listens on: fleet-view fails at
	// --listen before it reaches the server.
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--kubeconfig", filepath.Join(dir, "missing")}, "kubeconfig"},
		{[]string{"--kubeconfig", kubeconfig, "--context", "nope"}, "kubeconfig"},
		{[]string{"--kubeconfig", kubeconfig, "--listen", "no-port"}, "--listen no-port"},
	} {
		cmd := newRootCommand()
		cmd.SetArgs(append([]string{"fleet-view"}, tc.args...))
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("fleet-view %v: got %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
}
