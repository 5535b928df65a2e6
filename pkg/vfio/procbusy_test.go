package vfio_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpudra/gpudra/pkg/vfio"
)

// TestProcHolders builds a procfs tree: a process holding /dev/nvidia3
// (the GPU's node), one holding another GPU's, one holding nothing.
func TestProcHolders(t *testing.T) {
	root := t.TempDir()
	gpuDir := filepath.Join(root, "driver/nvidia/gpus/0000:1b:00.0")
	mustMkdir(t, gpuDir)
	if err := os.WriteFile(filepath.Join(gpuDir, "information"), []byte("Model: \t NVIDIA H100 80GB HBM3\nIRQ:   \t 42\nDevice Minor: \t 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	proc := func(pid, comm string, links ...string) {
		fd := filepath.Join(root, pid, "fd")
		mustMkdir(t, fd)
		if err := os.WriteFile(filepath.Join(root, pid, "comm"), []byte(comm+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		for i, l := range links {
			if err := os.Symlink(l, filepath.Join(fd, string(rune('0'+i)))); err != nil {
				t.Fatal(err)
			}
		}
	}
	proc("100", "nvidia-persistenced", "/dev/nvidiactl", "/dev/nvidia3")
	proc("200", "python", "/dev/nvidia30")
	proc("300", "bash", "/dev/null")

	got, err := vfio.ProcHolders{Root: root}.Holders(t.Context(), "0000:1b:00.0")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"nvidia-persistenced (pid 100)"}; !slices.Equal(got, want) {
		t.Errorf("Holders = %v, want %v", got, want)
	}
	if _, err := (vfio.ProcHolders{Root: root}).Holders(t.Context(), "0000:43:00.0"); err == nil {
		t.Error("a GPU the driver does not list: no error, want one naming it")
	}
}

func mustMkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}
