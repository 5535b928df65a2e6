package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/localcluster/controlplane"
	"github.com/gpudra/gpudra/localcluster/realnode/kubelet"
)

// TestBuildBinariesProgress: BuildBinaries says it builds what is not
// cached, and says nothing of what is (a message once called a cold
// build "cached"). The context is cancelled: the build of containerd,
// which is not cached, fails at once.
func TestBuildBinariesProgress(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("GPUDRA_REAL_NODE_BIN", cache)
	version, err := controlplane.KubernetesVersion()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kubelet.BinaryPath(cache, version), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var lines []string
	if _, err := BuildBinaries(ctx, WithProgress(func(s string) { lines = append(lines, s) })); err == nil {
		t.Fatal("BuildBinaries with a cancelled context and nothing of containerd built: no error")
	}
	if len(lines) != 1 || !strings.HasPrefix(lines[0], "building containerd into "+cache+" (not cached") {
		t.Errorf("progress %q; want one line, that containerd is being built (the kubelet is cached)", lines)
	}
	if _, err := os.Stat(filepath.Join(cache, "kubelet-"+version)); err != nil {
		t.Error(err)
	}
}
