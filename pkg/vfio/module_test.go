package vfio_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpudra/gpudra/pkg/vfio"
)

func TestModprobe(t *testing.T) {
	t.Run("runs the command with the module", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "args")
		m := vfio.Modprobe{Command: []string{"sh", "-c", `echo "$@" > "$0"`, out, "-b"}}
		if err := m.Load(context.Background(), "vfio-pci"); err != nil {
			t.Fatalf("Load: %v", err)
		}
		if data, _ := os.ReadFile(out); string(data) != "-b vfio-pci\n" {
			t.Errorf("modprobe got arguments %q, want \"-b vfio-pci\"", data)
		}
	})
	t.Run("failure carries the output", func(t *testing.T) {
		m := vfio.Modprobe{Command: []string{"sh", "-c", `echo "modprobe: FATAL: Module $0 not found" >&2; exit 1`}}
		err := m.Load(context.Background(), "nvgrace-gpu-vfio-pci")
		if want := "exit status 1: modprobe: FATAL: Module nvgrace-gpu-vfio-pci not found"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Load = %v, want %q", err, want)
		}
	})
	t.Run("honours the context", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		m := vfio.Modprobe{Command: []string{"sleep", "10"}}
		if err := m.Load(ctx, "vfio-pci"); err == nil {
			t.Error("Load with a cancelled context succeeded")
		}
	})
	t.Run("refuses what is not a module name", func(t *testing.T) {
		for _, name := range []string{"", "-r", "../x"} {
			if err := (vfio.Modprobe{Command: []string{"true"}}).Load(context.Background(), name); err == nil {
				t.Errorf("Load(%q) succeeded", name)
			}
		}
	})
}

func TestBusyError(t *testing.T) {
	err := error(&vfio.BusyError{GPU: gpu, Holders: []string{"nvidia-persistenced (pid 1)"}})
	if !errors.Is(err, vfio.ErrBusy) {
		t.Error("BusyError is not ErrBusy")
	}
	if got, want := err.Error(), "GPU 0000:1b:00.0 is in use by nvidia-persistenced (pid 1)"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if holders, err := (vfio.NotBusy{}).Holders(context.Background(), gpu); err != nil || len(holders) != 0 {
		t.Errorf("NotBusy.Holders = %v, %v", holders, err)
	}
}
