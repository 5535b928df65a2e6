package clustertest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestShortTempDir(t *testing.T) {
	var dir string
	t.Run("made", func(t *testing.T) {
		dir = ShortTempDir(t)
		// Room for a node's registration socket below it.
		sock := filepath.Join(dir, "n", "dgx-h100-0", "plugins_registry", "compute-domain.nvidia.com-reg.sock")
		if len(sock) > 107 {
			t.Errorf("socket path %s is %d bytes, over the limit", sock, len(sock))
		}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			t.Fatalf("%s: %v", dir, err)
		}
	})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s outlived its test: %v", dir, err)
	}
}

func TestPoll(t *testing.T) {
	n := 0
	if err := Poll(context.Background(), time.Second, func() bool { n++; return n == 3 }); err != nil || n != 3 {
		t.Errorf("Poll: %v after %d checks, want nil after 3", err, n)
	}
	err := Poll(context.Background(), 3*PollInterval, func() bool { return false })
	if err == nil || !strings.Contains(err.Error(), "not within 150ms") {
		t.Errorf("Poll past its timeout: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = Poll(ctx, time.Minute, func() bool { return false })
	if err == nil || !strings.Contains(err.Error(), "the test's time") {
		t.Errorf("Poll past its context: %v", err)
	}
}
