package shorttemp

import (
	"os"
	"path/filepath"
	"testing"
)

func TestDir(t *testing.T) {
	var dir string
	t.Run("made", func(t *testing.T) {
		dir = Dir(t)
		// Room for a kubelet plugin's registration socket below it.
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
