package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestWebhookFlagErrors: a bad command line is refused before anything
// starts, naming the flag.
func TestWebhookFlagErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "tls.crt")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--tls-cert-file and --tls-private-key-file, or --self-signed-cert-dir"},
		{[]string{"--tls-cert-file", missing}, "--tls-private-key-file: give both or neither"},
		{[]string{"--tls-cert-file", missing, "--tls-private-key-file", missing}, "--tls-cert-file: stat " + missing},
		{[]string{"--self-signed-cert-dir", t.TempDir()}, "--self-signed-hosts is required"},
		{[]string{"--self-signed-cert-dir", t.TempDir(), "--self-signed-hosts", "x.svc", "--port", "0"}, "--port 0: must be from 1 to 65535"},
		{[]string{"--self-signed-cert-dir", t.TempDir(), "--self-signed-hosts", "x.svc", "--driver-name", "", "--compute-domain-driver-name", ""}, "nothing to validate"},
		{[]string{"--self-signed-cert-dir", t.TempDir(), "--self-signed-hosts", "x.svc", "--compute-domain-driver-name", "gpu.nvidia.com"}, `--driver-name, --compute-domain-driver-name: drivers`},
	} {
		cmd := newRootCommand()
		cmd.SetArgs(append([]string{"webhook"}, tc.args...))
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("webhook %v: error %v, want one with %q", tc.args, err, tc.want)
		}
	}
}
